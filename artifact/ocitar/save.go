package ocitar

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	oras "oras.land/oras-go/v2"
	"oras.land/oras-go/v2/errdef"
)

// Save writes a tar to path through fill, which copies the artifact into the Writer it is given (remote.Pull, or
// Copy from the local store) and tags it. The tar is written beside path and renamed into place once complete, so
// a failed save leaves nothing at path; "-" writes to stdout as it goes.
func Save(path string, fill func(w *Writer) error) error {
	if path == "-" {
		w, err := NewWriter(os.Stdout)
		if err != nil {
			return err
		}
		if err := fill(w); err != nil {
			return err
		}
		return w.Close()
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".partial-*")
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	w, err := NewWriter(f)
	if err != nil {
		return err
	}
	if err := fill(w); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	done = true
	return nil
}

// Copy copies the artifact srcRef names in src to dst, tagged dstRef, and with referrers the manifests referring to
// it (signatures, SBOMs) found by src's Predecessors and cosign's sha256-<hex>.sig/.att/.sbom tags of its digest
// (which refer by name only), tagged the same in dst. oras-go pushes the root last and tags it after, so an error
// leaves dst without the tag.
func Copy(ctx context.Context, src oras.ReadOnlyGraphTarget, srcRef string, dst oras.Target, dstRef string, referrers bool) (ocispec.Descriptor, error) {
	g := oras.CopyGraphOptions{}
	if _, ok := dst.(*Writer); ok {
		g.Concurrency = 1 // a tar takes one blob at a time
	}
	if !referrers {
		return oras.Copy(ctx, src, srcRef, dst, dstRef, oras.CopyOptions{CopyGraphOptions: g})
	}
	root, err := oras.ExtendedCopy(ctx, src, srcRef, dst, dstRef, oras.ExtendedCopyOptions{ExtendedCopyGraphOptions: oras.ExtendedCopyGraphOptions{CopyGraphOptions: g}})
	if err != nil {
		return root, err
	}
	for _, suffix := range []string{".sig", ".att", ".sbom"} {
		tag := root.Digest.Algorithm().String() + "-" + root.Digest.Encoded() + suffix
		if _, err := src.Resolve(ctx, tag); err != nil {
			if errors.Is(err, errdef.ErrNotFound) {
				continue
			}
			return root, err
		}
		if _, err := oras.Copy(ctx, src, tag, dst, tag, oras.CopyOptions{CopyGraphOptions: g}); err != nil {
			return root, fmt.Errorf("cosign tag %s: %w", tag, err)
		}
	}
	return root, nil
}

// cosignTag matches cosign's tags for a digest (sha256-<hex>.sig, .att, .sbom): they name their subject, they are
// not an artifact a user loads.
var cosignTag = regexp.MustCompile(`^sha(256|512)-[0-9a-f]+\.(sig|att|sbom)$`)

// Root is the artifact the archive holds: its one named or tagged manifest (cosign's tags aside), or its one
// manifest.
func (a *Archive) Root() (Entry, error) {
	var tagged []Entry
	for _, e := range a.Entries {
		if e.Name != "" || (e.Tag != "" && !cosignTag.MatchString(e.Tag)) {
			tagged = append(tagged, e)
		}
	}
	switch {
	case len(tagged) == 1:
		return tagged[0], nil
	case len(tagged) == 0 && len(a.Entries) == 1:
		return a.Entries[0], nil
	case len(a.Entries) == 0:
		return Entry{}, errors.New("index.json lists no manifest")
	}
	names := make([]string, 0, len(tagged))
	for _, e := range tagged {
		n := e.Name
		if n == "" {
			n = e.Tag
		}
		names = append(names, n)
	}
	if len(tagged) == 0 {
		return Entry{}, fmt.Errorf("index.json lists %d manifests and tags none: which one is the artifact is not said", len(a.Entries))
	}
	return Entry{}, fmt.Errorf("index.json tags %d artifacts (%s): load takes an archive of one", len(tagged), strings.Join(names, ", "))
}
