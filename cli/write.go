package cli

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/pack"
	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/internal/diskio"
)

// writeFlags say what unpack and fetch may do to the directory they write into.
type writeFlags struct {
	force, keepOld, imageRootfs, strict bool
}

func (w *writeFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&w.force, "force", false, "replace files that already exist in DIR (read-only ones too); directories are never replaced")
	fl.BoolVar(&w.keepOld, "keep-old-files", false, "refuse to replace existing files, before writing anything (the default; as oras pull --keep-old-files)")
	fl.BoolVar(&w.imageRootfs, "image-rootfs", false, "REF may be a container image: write its root filesystem into DIR")
	fl.BoolVar(&w.strict, "strict", false, "fail, before writing anything, when an --include glob matches no file (default: warn)")
	cmd.MarkFlagsMutuallyExclusive("force", "keep-old-files")
}

// check refuses, before anything is written, a container image without --image-rootfs and existing paths
// without --force.
func (w *writeFlags) check(ref, dir string) func([]artifact.Layer) error {
	return func(layers []artifact.Layer) error {
		if err := w.checkImage(ref, dir, layers); err != nil {
			return err
		}
		if err := pack.CheckTargets(dir, layers, w.force); err != nil {
			return err
		}
		return checkSpace(dir, layers)
	}
}

// checkImage refuses a container image without --image-rootfs.
func (w *writeFlags) checkImage(ref, dir string, layers []artifact.Layer) error {
	n := 0
	for _, l := range layers {
		if l.Image {
			n++
		}
	}
	if n > 0 && !w.imageRootfs {
		return fmt.Errorf("%s is a container image (%d filesystem layers), not a model: nothing was written; pass --image-rootfs to write its root filesystem into %s", ref, n, dir)
	}
	return nil
}

// unmatched says which --include globs keep no file of the layers the kind filter left: a typo otherwise ends in
// an empty directory and exit 0. Under --strict that is an error, before anything is written.
func (w *writeFlags) unmatched(ws *warnings, ref string, include []string, candidates []artifact.Layer) error {
	paths := make([]string, len(candidates))
	for i, l := range candidates {
		paths[i] = l.Path
	}
	globs := artifact.UnmatchedGlobs(include, paths)
	if w.strict && len(globs) > 0 {
		return fmt.Errorf("--include %s: matches no file of %s; nothing was written (--strict)", quoteGlobs(globs), ref)
	}
	for _, g := range globs {
		ws.add(fmt.Sprintf("--include %q matches no file of %s", g, ref))
	}
	return nil
}

// quoteGlobs lists globs quoted, comma-separated.
func quoteGlobs(globs []string) string {
	q := make([]string, len(globs))
	for i, g := range globs {
		q[i] = strconv.Quote(g)
	}
	return strings.Join(q, ", ")
}

// skipIdentical wraps a layer selection so that files DIR already holds byte for byte are not written again: a
// fetch run again after an interruption writes what is missing instead of refusing what it wrote before. unpack
// follows the same rule inside pack.Unpack (pack.Identical there too).
func (w *writeFlags) skipIdentical(dir string, sel func(artifact.Layer) bool) func(artifact.Layer) bool {
	return func(l artifact.Layer) bool {
		return sel(l) && !pack.Identical(dir, l)
	}
}

// checkSpace refuses, before anything is written, layers whose bytes still to write exceed the free space of the
// file system DIR is on (DIR, or its nearest existing parent when it is yet to be made): a pull that would fill the
// disk fails at once with both numbers instead of after hours with ENOSPC. Still to write are the layers' sizes
// less the files DIR holds byte for byte (counted only when the sum does not fit, as reading them costs a hash)
// and what an interrupted fetch kept in DIR/.modelpack-partial. A tar layer's extracted size can exceed its blob's:
// the check is a floor, not a promise. A file system whose free space cannot be read is not checked.
func checkSpace(dir string, layers []artifact.Layer) error {
	var need int64
	for _, l := range layers {
		need += l.Size
	}
	return needSpace(dir, need, "free space there, or choose layers with --filter/--include", func() (held int64) {
		for _, l := range layers {
			if pack.Identical(dir, l) {
				held += l.Size
			}
		}
		_ = filepath.WalkDir(filepath.Join(dir, remote.PartialDir), func(_ string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if fi, err := d.Info(); err == nil {
					held += fi.Size()
				}
			}
			return nil
		})
		return held
	})
}

// needSpace refuses need bytes more than the free space of dir's file system (dir's nearest existing parent when
// dir is yet to be made). held, if set, counts the bytes of need already there; it runs only when need does not
// fit, being costly. hint says what the user can do.
func needSpace(dir string, need int64, hint string, held func() int64) error {
	at := dir
	for {
		if _, err := os.Stat(at); err == nil {
			break
		}
		up := filepath.Dir(at)
		if up == at {
			return nil
		}
		at = up
	}
	free, err := diskio.FreeSpace(at)
	if err != nil || need <= free {
		return nil
	}
	if held != nil {
		if need -= held(); need <= free {
			return nil
		}
	}
	return fmt.Errorf("%s: %s (%d bytes) to write, more than the %s (%d bytes) free on the file system of %s; nothing was written (%s)",
		dir, humanBytes(need), need, humanBytes(free), free, at, hint)
}
