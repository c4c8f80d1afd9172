package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/pack"
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
		return pack.CheckTargets(dir, layers, w.force)
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
