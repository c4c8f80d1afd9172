package remote

import (
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"sync"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/artifact"
)

// claims are the paths the model layers of one fetch write. Model layers are written concurrently on the
// understanding that their paths are disjoint; a tar layer's content is known only once extracted, so each layer
// claims its files (and their parent directories) before they are moved into place. A path two layers claim, or
// a file where another layer needs a directory, is artifact.ErrPathConflict naming both layers, as the node's
// cache refuses it: which layer won would depend on timing.
type claims struct {
	mu sync.Mutex
	by map[string]claim
}

type claim struct {
	layer artifact.Layer
	dir   bool
}

func (c *claims) take(l artifact.Layer, files []string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[string]claim{}
	}
	conflict := func(other artifact.Layer, p, why string) error {
		return fmt.Errorf("%w: layer %s (%s) and layer %s (%s): %q: %s", artifact.ErrPathConflict,
			other.Digest, other.Path, l.Digest, l.Path, p, why)
	}
	same := func(d digest.Digest) bool { return d == l.Digest }
	for _, p := range files {
		if old, ok := c.by[p]; ok && !same(old.layer.Digest) {
			if old.dir {
				return conflict(old.layer, p, "a directory of one is a file of the other")
			}
			return conflict(old.layer, p, "both hold that file")
		}
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if old, ok := c.by[d]; ok && !old.dir && !same(old.layer.Digest) {
				return conflict(old.layer, d, "a file of one is a directory of the other")
			}
		}
	}
	for _, p := range files {
		c.by[p] = claim{layer: l}
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := c.by[d]; !ok {
				c.by[d] = claim{layer: l, dir: true}
			}
		}
	}
	return nil
}

// filesUnder lists the non-directories under dir, as slash paths relative to it.
func filesUnder(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err == nil {
			out = append(out, filepath.ToSlash(rel))
		}
		return err
	})
	return out, err
}
