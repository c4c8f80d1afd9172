package pack

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"oras.land/oras-go/v2/content"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/archive"
	"github.com/modelpack/modelpack/cas"
)

// UnpackOptions select what Unpack writes.
type UnpackOptions struct {
	// Kinds, if set, keeps only layers of these kinds.
	Kinds []artifact.Kind
	// Include, if set, keeps only layers whose path, or a parent directory of it, matches one of these globs
	// (artifact.MatchInclude: "**" spans directories, a glob without "/" matches at any depth).
	Include []string
	// Concurrency bounds the layers written at once; 0 means GOMAXPROCS.
	Concurrency int
	Progress    Progress
	// Force replaces existing files (CheckTargets); without it Unpack refuses before writing anything.
	Force bool
}

// Select reports whether a layer passes the options' filters.
func (o UnpackOptions) Select(l artifact.Layer) bool {
	if len(o.Kinds) > 0 {
		ok := false
		for _, k := range o.Kinds {
			ok = ok || l.Kind == k
		}
		if !ok {
			return false
		}
	}
	if len(o.Include) == 0 {
		return true
	}
	return artifact.MatchInclude(o.Include, l.Path)
}

// Unpack writes the files of a model manifest, whose blobs src holds, into dir: raw layers as files with the
// mode their metadata annotation records, tar layers extracted with package archive, container-image layers
// applied in order (their whiteouts apply to what they stack on, not to what dir held). Every blob is verified
// against its digest as it is read, into a staging tree inside dir that is moved into place only once every layer
// verified, all or nothing: a failed unpack leaves dir as it was (and a dir it created, gone). Raw files that share
// a digest are fetched once and copied. A layer path that would land outside dir is refused, and so, before anything is
// written, are existing paths (see CheckTargets) unless opts.Force; files already there with the layer's exact
// bytes are left as they are. Files get the modification time their
// metadata annotation records, as fetch and tar extraction give them. It returns the files written, relative to
// dir, sorted.
func Unpack(ctx context.Context, src content.Fetcher, manifest ocispec.Manifest, dir string, opts UnpackOptions) (_ []string, err error) {
	layers, err := artifact.Layers(manifest)
	if err != nil {
		return nil, err
	}
	var model, image, same []artifact.Layer
	for _, l := range layers {
		switch {
		case !opts.Select(l):
		case l.Image:
			image = append(image, l)
		case Identical(dir, l):
			same = append(same, l) // already there, byte for byte (a rerun): nothing to write
		default:
			model = append(model, l)
		}
	}
	if err := CheckTargets(dir, append(append([]artifact.Layer{}, model...), image...), opts.Force); err != nil {
		return nil, err
	}
	if opts.Progress != nil {
		var total int64
		for _, l := range append(model, image...) {
			total += l.Size
		}
		opts.Progress.Start(total)
	}
	removeDir, err := archive.MakeDir(dir)
	if err != nil {
		return nil, err
	}
	// Everything is written into a staging tree inside dir and moved into place only once every layer verified,
	// all or nothing (archive.MergeInto): a failed unpack leaves dir as it was.
	stage, err := os.MkdirTemp(dir, ".modelpack-unpack-")
	if err != nil {
		removeDir()
		return nil, err
	}
	defer func() {
		os.RemoveAll(stage)
		if err != nil {
			removeDir()
		}
	}()
	root, err := os.OpenRoot(stage)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	g, gctx := errgroup.WithContext(ctx)
	limit := opts.Concurrency
	if limit <= 0 {
		limit = runtime.GOMAXPROCS(0)
	}
	g.SetLimit(limit)
	// Model layers are written concurrently, so one path claimed by two layers (two tar layers, a raw and a tar
	// layer) would end up with whichever came last: each layer claims its paths before they land, and a conflict
	// is artifact.ErrPathConflict naming both layers, as fetch and the node's driver refuse it.
	claims := &archive.Claims{}
	for _, l := range append(append([]artifact.Layer{}, model...), same...) {
		if name, err := archive.CleanPath(l.Path); err == nil && l.Format == artifact.FormatRaw {
			if err := claims.Take(l, []string{name}); err != nil {
				return nil, err
			}
		}
	}
	// Raw files that share a digest are fetched and written once, then copied.
	var tars []artifact.Layer
	byDigest := map[digest.Digest][]artifact.Layer{}
	var digests []digest.Digest
	for _, l := range model {
		if l.Format != artifact.FormatRaw {
			tars = append(tars, l)
			continue
		}
		if byDigest[l.Digest] == nil {
			digests = append(digests, l.Digest)
		}
		byDigest[l.Digest] = append(byDigest[l.Digest], l)
	}
	for _, d := range digests {
		g.Go(func() error {
			ls := byDigest[d]
			if err := unpackRaw(gctx, src, root, ls, opts.Progress); err != nil {
				return fmt.Errorf("layer %s (%s): %w", ls[0].Path, d, err)
			}
			return nil
		})
	}
	layerDirs := make([]string, len(tars))
	for i, l := range tars {
		g.Go(func() error {
			// A tar layer's paths are known once extracted: extract it aside, then claim them.
			layerDirs[i] = fmt.Sprintf(".modelpack-layer-%d", i)
			if err := unpackTar(gctx, src, filepath.Join(stage, layerDirs[i]), l, claims, opts.Progress); err != nil {
				return fmt.Errorf("layer %s (%s): %w", l.Path, l.Digest, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	// Image layers stack: each applies over the previous ones, whiteouts included, over the model's files.
	if len(image) > 0 {
		layerDirs = append(layerDirs, ".modelpack-image")
	}
	for _, l := range image {
		if err := extractVerified(ctx, src, l, filepath.Join(stage, ".modelpack-image"), archive.Options{AbsoluteSymlinks: true}, opts.Progress); err != nil {
			return nil, fmt.Errorf("layer %s: %w", l.Digest, err)
		}
	}
	for _, d := range layerDirs {
		if _, err := archive.MergeInto(filepath.Join(stage, d), stage); err != nil {
			return nil, err
		}
		if err := os.RemoveAll(filepath.Join(stage, d)); err != nil {
			return nil, err
		}
	}
	if _, err := archive.MergeInto(stage, dir); err != nil {
		return nil, err
	}
	return filesWritten(dir, append(model, same...), len(image) > 0)
}

// filesWritten lists the files the layers put in dir: a raw layer's file, and what lies below a tar layer's
// directory (or below dir, for image layers and tar layers unpacked at the top).
func filesWritten(dir string, model []artifact.Layer, image bool) ([]string, error) {
	seen := map[string]bool{}
	var files []string
	add := func(rel string) error {
		base := filepath.Join(dir, filepath.FromSlash(rel))
		return filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				return nil
			}
			r, _ := filepath.Rel(dir, p)
			if r = filepath.ToSlash(r); !seen[r] {
				seen[r] = true
				files = append(files, r)
			}
			return nil
		})
	}
	if image {
		model = []artifact.Layer{{}}
	}
	for _, l := range model {
		name, _ := archive.CleanPath(l.Path)
		if err := add(name); err != nil {
			return nil, err
		}
	}
	sort.Strings(files)
	return files, nil
}

// unpackTar extracts a tar layer into stage and claims its files.
func unpackTar(ctx context.Context, src content.Fetcher, stage string, l artifact.Layer, claims *archive.Claims, p Progress) error {
	if err := extractVerified(ctx, src, l, stage, archive.Options{}, p); err != nil {
		return err
	}
	files, err := archive.FilesUnder(stage)
	if err != nil {
		return err
	}
	return claims.Take(l, files)
}

// unpackRaw writes the raw layers ls, which share one digest, into the staging tree: the blob is fetched and
// verified once, into the first layer's file, and copied to the others. Each file gets its layer's mode and mtime.
func unpackRaw(ctx context.Context, src content.Fetcher, root *os.Root, ls []artifact.Layer, p Progress) error {
	names := make([]string, len(ls))
	for i, l := range ls {
		name, err := archive.CleanPath(l.Path)
		if err != nil {
			return err
		}
		if name == "" {
			return fmt.Errorf("raw layer path %q names the model root: %w", l.Path, archive.ErrUnsafePath)
		}
		if parent := path.Dir(name); parent != "." {
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return unsafe(err)
			}
		}
		names[i] = name
	}
	first, err := root.OpenFile(names[0], os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return unsafe(err)
	}
	defer first.Close()
	rc, err := fetchVerified(ctx, src, ls[0].Descriptor, p)
	if err != nil {
		return err
	}
	defer rc.Close()
	if _, err := io.Copy(first, rc); err != nil {
		return err
	}
	for i, l := range ls {
		f := first
		if i > 0 {
			if f, err = root.OpenFile(names[i], os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err != nil {
				return unsafe(err)
			}
			_, err = io.Copy(f, io.NewSectionReader(first, 0, l.Size))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
		mode := os.FileMode(0o644)
		meta, ok := fileMetadata(l.Annotations)
		if ok && meta.Mode != 0 {
			mode = os.FileMode(meta.Mode).Perm()
		}
		if err := root.Chmod(names[i], mode); err != nil {
			return err
		}
		if mtime := meta.ModTime; ok && !mtime.IsZero() {
			if err := root.Chtimes(names[i], mtime, mtime); err != nil {
				return err
			}
		}
	}
	return first.Close()
}

func extractVerified(ctx context.Context, src content.Fetcher, l artifact.Layer, dir string, opts archive.Options, p Progress) error {
	rc, err := fetchVerified(ctx, src, l.Descriptor, p)
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := archive.Extract(rc, l.Format, dir, opts); err != nil {
		return err
	}
	// Read to the end so the digest is checked even if the archive ended before the blob did.
	_, err = io.Copy(io.Discard, rc)
	return err
}

// unsafe marks os.Root's refusal of a path that escapes the directory as archive.ErrUnsafePath.
func unsafe(err error) error {
	if err != nil && strings.Contains(err.Error(), "path escapes from parent") {
		return fmt.Errorf("%w: %w", archive.ErrUnsafePath, err)
	}
	return err
}

// fetchVerified opens a blob whose reader fails at its end unless the bytes match the descriptor (cas.Verifier).
func fetchVerified(ctx context.Context, src content.Fetcher, d ocispec.Descriptor, p Progress) (io.ReadCloser, error) {
	rc, err := src.Fetch(ctx, d)
	if err != nil {
		return nil, err
	}
	return readCloser{cas.NewVerifier(d.Digest, d.Size).Reader(&countingReader{rc: rc, progress: p}), rc}, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// fileMetadata reads the file metadata annotation, current or legacy.
func fileMetadata(a map[string]string) (artifact.FileMetadata, bool) {
	var m artifact.FileMetadata
	for _, k := range []string{artifact.AnnotationFileMetadata, artifact.LegacyAnnotationFileMetadata} {
		if v := a[k]; v != "" {
			if err := json.Unmarshal([]byte(v), &m); err == nil {
				return m, true
			}
		}
	}
	return m, false
}
