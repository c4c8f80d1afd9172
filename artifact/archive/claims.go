package archive

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sync"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/artifact"
)

// Claims are the paths the model layers of one fetch or unpack write. Model layers are written concurrently on the
// understanding that their paths are disjoint; a tar layer's content is known only once extracted, so each layer
// claims its files (and their parent directories) before they are moved into place. A path two layers claim, or
// a file where another layer needs a directory, is artifact.ErrPathConflict naming both layers, as the node's
// cache refuses it: which layer won would depend on timing.
type Claims struct {
	mu sync.Mutex
	by map[string]claim
}

type claim struct {
	layer artifact.Layer
	dir   bool
}

// Take claims files (slash paths relative to the model's root) for l, or returns the conflict.
func (c *Claims) Take(l artifact.Layer, files []string) error {
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

// FilesUnder lists the non-directories under dir, as slash paths relative to it.
func FilesUnder(dir string) ([]string, error) {
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

// MergeInto moves the tree under src into dst with renames, replacing what is in the way (directories merge),
// and returns the regular files moved, relative to dst. It is all or nothing: what it replaces is set aside until
// the last rename, and on any failure every rename is undone and dst is left as it was (src keeps the rest).
func MergeInto(src, dst string) (_ []string, err error) {
	// src is inside dst (its staging directory). Everything in dst is reached through its root, so a symlink
	// already there (an image layer's, say) is not followed out of it.
	root, err := os.OpenRoot(dst)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	srcRel, err := filepath.Rel(dst, src)
	if err != nil {
		return nil, err
	}
	j := &journal{root: root, dst: dst}
	defer func() {
		if err != nil {
			j.undo()
		}
		j.drop()
	}()
	var files []string
	var walk func(rel string) error
	walk = func(rel string) error {
		entries, err := os.ReadDir(filepath.Join(src, rel))
		if err != nil {
			return err
		}
		for _, e := range entries {
			r := filepath.Join(rel, e.Name())
			from, to := filepath.Join(srcRel, r), filepath.Join(dst, r)
			fi, err := root.Lstat(r)
			switch {
			case err == nil && fi.IsDir() && e.IsDir():
				if err := walk(r); err != nil {
					return err
				}
				// The directory of the layer merged last gives its mode, as extracting over it would (after its
				// contents moved, so a mode without write permission does not stop them).
				si, err := os.Lstat(filepath.Join(src, r))
				if err != nil {
					return err
				}
				if si.Mode().Perm() != fi.Mode().Perm() {
					if err := root.Chmod(r, si.Mode().Perm()); err != nil {
						return err
					}
					j.ops = append(j.ops, op{rel: r, mode: fi.Mode().Perm(), chmod: true})
				}
				continue
			case err == nil:
				if err := j.setAside(r); err != nil {
					return err
				}
			case !errors.Is(err, fs.ErrNotExist):
				return err
			}
			if mergeHook != nil {
				if err := mergeHook(r); err != nil {
					return err
				}
			}
			if err := root.Rename(from, r); err != nil {
				return err
			}
			j.ops = append(j.ops, op{rel: r, from: from})
			if e.IsDir() {
				if err := filepath.WalkDir(to, func(p string, d fs.DirEntry, err error) error {
					if err == nil && d.Type().IsRegular() {
						rp, _ := filepath.Rel(dst, p)
						files = append(files, filepath.ToSlash(rp))
					}
					return err
				}); err != nil {
					return err
				}
			} else if e.Type().IsRegular() {
				files = append(files, filepath.ToSlash(r))
			}
		}
		return nil
	}
	return files, walk("")
}

// mergeHook, if set, runs before each rename into dst: the tests' way to make one fail.
var mergeHook func(rel string) error

// journal records what a merge did to dst, to undo it.
type journal struct {
	root  *os.Root
	dst   string
	aside string // dst-relative directory holding what the merge replaced, made when first needed
	ops   []op
}

// op is one change: an entry renamed in from src (from), an entry set aside (aside), or a directory's mode changed.
type op struct {
	rel, from, aside string
	chmod            bool
	mode             fs.FileMode
}

// setAside moves the entry at rel out of the way, into the journal's directory in dst.
func (j *journal) setAside(rel string) error {
	if j.aside == "" {
		d, err := os.MkdirTemp(j.dst, ".modelpack-replaced-")
		if err != nil {
			return err
		}
		j.aside = filepath.Base(d)
	}
	to := filepath.Join(j.aside, fmt.Sprint(len(j.ops)))
	if err := j.root.Rename(rel, to); err != nil {
		return err
	}
	j.ops = append(j.ops, op{rel: rel, aside: to})
	return nil
}

// undo reverses the changes, newest first: dst is as before the merge, and what came from src is back in it.
func (j *journal) undo() {
	for i := len(j.ops) - 1; i >= 0; i-- {
		o := j.ops[i]
		switch {
		case o.chmod:
			j.root.Chmod(o.rel, o.mode)
		case o.from != "":
			j.root.Rename(o.rel, o.from)
		case o.aside != "":
			j.root.Rename(o.aside, o.rel)
		}
	}
	j.ops = nil
}

// drop deletes what was set aside (nothing, after undo).
func (j *journal) drop() {
	if j.aside != "" {
		if err := j.root.RemoveAll(j.aside); err != nil {
			// A read-only directory set aside: make it removable, as the caller's own cleanup would.
			fs.WalkDir(j.root.FS(), j.aside, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					j.root.Chmod(p, 0o700)
				}
				return nil
			})
			j.root.RemoveAll(j.aside)
		}
	}
}

// MakeDir creates dir and its missing parents, and returns remove, which deletes the directories it created as
// long as they are empty: a failed unpack or fetch into a new directory leaves no trace of it.
func MakeDir(dir string) (remove func(), err error) {
	var created []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil || !errors.Is(err, fs.ErrNotExist) {
			break
		}
		created = append(created, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return func() {
		for _, d := range created {
			if os.Remove(d) != nil {
				return
			}
		}
	}, nil
}
