package pack

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/archive"
	"github.com/modelpack/modelpack/cas"
)

// ExistsError is the refusal to write over what a target directory already holds. It is returned before
// anything is written, so a refused unpack or fetch changes nothing.
type ExistsError struct {
	Dir string
	// Replaceable are existing files (read-only ones too) and directories a tar layer would write into: --force
	// replaces them.
	Replaceable []string
	// Blocking are paths whose type is wrong — a directory where a file goes, a file where a directory goes — which
	// even --force does not remove.
	Blocking []string
}

func (e *ExistsError) Error() string {
	if len(e.Blocking) > 0 {
		return fmt.Sprintf("%s: cannot write the model: %s; move them away first (--force replaces files, never directories)",
			e.Dir, listPaths(e.Blocking))
	}
	return fmt.Sprintf("%s already holds %s; nothing was written (--force replaces them)", e.Dir, listPaths(e.Replaceable))
}

func listPaths(ps []string) string {
	const show = 5
	s := strings.Join(ps[:min(len(ps), show)], ", ")
	if len(ps) > show {
		s += fmt.Sprintf(" and %d more", len(ps)-show)
	}
	return s
}

// CheckTargets looks at what writing layers into dir would replace, before anything is written. A raw layer's
// file, a tar layer's directory and, for container-image layers, a non-empty dir count as existing; unless force,
// they are refused. A directory standing where a file goes, or a file where a directory goes, is always refused:
// replacing it would delete more than the artifact holds.
func CheckTargets(dir string, layers []artifact.Layer, force bool) error {
	e := &ExistsError{Dir: dir}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case !fi.IsDir():
		e.Blocking = append(e.Blocking, dir+" is a file, not a directory")
		return e
	}
	for _, l := range layers {
		if l.Image {
			entries, err := os.ReadDir(dir)
			if err != nil {
				return err
			}
			if len(entries) > 0 {
				e.Replaceable = append(e.Replaceable, fmt.Sprintf("%d entries (a container image's root filesystem is written over it)", len(entries)))
			}
			continue
		}
		name, err := archive.CleanPath(l.Path)
		if err != nil {
			return fmt.Errorf("layer %s: %w", l.Digest, err)
		}
		wantDir := l.Format != artifact.FormatRaw
		if name == "" {
			if !wantDir {
				return fmt.Errorf("raw layer %s names the model root: %w", l.Digest, archive.ErrUnsafePath)
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				return err
			}
			if len(entries) > 0 {
				e.Replaceable = append(e.Replaceable, fmt.Sprintf("%d entries (layer %s unpacks at the top)", len(entries), l.Digest.Encoded()[:12]))
			}
			continue
		}
		// Every parent must be a directory, or absent.
		blocked := false
		for p := path.Dir(name); p != "."; p = path.Dir(p) {
			if fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(p))); err == nil && !fi.IsDir() {
				e.Blocking = append(e.Blocking, p+" is a file where "+name+" needs a directory")
				blocked = true
				break
			}
		}
		if blocked {
			continue
		}
		fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(name)))
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return err
		case fi.IsDir() && !wantDir:
			e.Blocking = append(e.Blocking, name+" is a directory where a file goes")
		case !fi.IsDir() && wantDir:
			e.Blocking = append(e.Blocking, name+" is a file where a directory goes")
		case fi.Mode()&0o222 == 0 && !fi.IsDir():
			e.Replaceable = append(e.Replaceable, name+" (read-only)")
		default:
			e.Replaceable = append(e.Replaceable, name)
		}
	}
	sort.Strings(e.Blocking)
	sort.Strings(e.Replaceable)
	if len(e.Blocking) > 0 || (len(e.Replaceable) > 0 && !force) {
		return e
	}
	return nil
}

// Identical reports whether dir already holds a raw layer's file with the layer's exact bytes (same size, same
// digest): writing it again would change nothing, so a rerun after an interruption skips it instead of refusing.
func Identical(dir string, l artifact.Layer) bool {
	if l.Image || l.Format != artifact.FormatRaw || l.Digest.Validate() != nil {
		return false
	}
	name, err := archive.CleanPath(l.Path)
	if err != nil || name == "" {
		return false
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return false
	}
	defer root.Close()
	if fi, err := root.Lstat(name); err != nil || !fi.Mode().IsRegular() || fi.Size() != l.Size {
		return false
	}
	f, err := root.Open(name)
	if err != nil {
		return false
	}
	defer f.Close()
	_, err = io.Copy(io.Discard, cas.NewVerifier(l.Digest, l.Size).Reader(f))
	return err == nil
}
