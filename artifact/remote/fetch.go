package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"time"

	"github.com/gofrs/flock"
	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/archive"
	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/diskio"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// FetchOptions tune Fetch.
type FetchOptions struct {
	// Concurrency is how many layers are written at once; 0 takes the repository's Options.Concurrency.
	Concurrency int
	// Reporter, if set, receives per-layer progress.
	Reporter Reporter
	// Select, if set, picks the layers to write; nil writes them all.
	Select func(artifact.Layer) bool
	// Check, if set, sees the selected layers before anything is written; its error stops the fetch.
	Check func([]artifact.Layer) error
	// Archive tunes the extraction of tar layers (limits); ReadOnly and KeepWhiteouts are honoured.
	Archive archive.Options
	// Sync flushes each raw file to disk before it is renamed into place, so a power loss cannot leave a file
	// with unwritten blocks under its final name. Like cp, curl and oras, Fetch does not by default: the rename
	// already keeps interrupted and failed downloads away from final names, and flushing makes the download run
	// at the disk's write speed instead of the page cache's.
	Sync bool
}

// Fetch writes the files of the model src names straight into dir, with no copy in a local store. Every byte is
// hashed as it arrives: a raw layer goes to a temporary file renamed to its final name only when its digest
// matches, a tar layer is extracted into a staging directory moved into place only when its digest matches.
// Container-image layers are applied in order (whiteouts included) and moved into place together. Downloads
// resume with HTTP Range after a dropped connection. On failure nothing is left under a final name by the failed
// layer; layers already verified stay.
func Fetch(ctx context.Context, src *Repository, dir string, opts FetchOptions) (*Result, error) {
	res, err := fetch(ctx, src, dir, opts)
	if err != nil {
		return nil, withOp("fetch", src, err)
	}
	res.Reference = src.Reference.String()
	return res, nil
}

func fetch(ctx context.Context, src *Repository, dir string, opts FetchOptions) (*Result, error) {
	if src.Reference.Reference == "" {
		return nil, fmt.Errorf("the reference needs a tag or digest")
	}
	t := newTracker(opts.Reporter)
	root, manifest, err := resolveManifest(ctx, src, src.Reference.Reference)
	if err != nil {
		return nil, err
	}
	layers, err := artifact.Layers(manifest)
	if err != nil {
		return nil, src.wrap("manifest "+root.Digest.String(), err)
	}
	var model, image []artifact.Layer
	for _, l := range layers {
		if opts.Select != nil && !opts.Select(l) {
			continue
		}
		if l.Image {
			image = append(image, l)
		} else {
			model = append(model, l)
		}
	}
	if opts.Check != nil {
		if err := opts.Check(append(append([]artifact.Layer{}, model...), image...)); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	staging, err := os.MkdirTemp(dir, ".modelpack-fetch-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(staging)

	partials := filepath.Join(dir, partialDir)
	defer os.Remove(partials) // once empty: nothing left to resume
	f := &fetcher{src: src, dir: dir, staging: staging, partials: partials, opts: opts, t: t}
	conc := opts.Concurrency
	if conc <= 0 {
		conc = src.opts.concurrency()
	}
	// Model layers have disjoint paths (each claims its own: see claims): write them concurrently. A layer that fails does not stop the others,
	// which land and stay.
	files := make([][]string, len(model))
	wait := each(ctx, len(model), conc, func(i int) (err error) {
		files[i], err = f.layer(ctx, model[i])
		return err
	})
	// Image layers stack, so they go one after the other into one staging tree, moved into place at the end.
	var imageFiles []string
	var imageErr error
	if len(image) > 0 {
		imageFiles, imageErr = f.imageLayers(ctx, image)
	}
	errs := wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := joinBlobErrors(append(errs, imageErr)); err != nil {
		return nil, err
	}
	res := t.result("", root)
	for _, fs := range files {
		res.Files = append(res.Files, fs...)
	}
	res.Files = append(res.Files, imageFiles...)
	sort.Strings(res.Files)
	return res, nil
}

// resolveManifest resolves reference to an image manifest, choosing this platform's manifest from an index.
func resolveManifest(ctx context.Context, src *Repository, reference string) (ocispec.Descriptor, ocispec.Manifest, error) {
	desc, rc, err := src.FetchReference(ctx, reference)
	if err != nil {
		return desc, ocispec.Manifest{}, err
	}
	b, err := readManifest(rc, desc)
	if err != nil {
		return desc, ocispec.Manifest{}, src.wrap("manifest "+reference, err)
	}
	switch {
	case artifact.IsIndex(desc.MediaType):
		var idx ocispec.Index
		if err := json.Unmarshal(b, &idx); err != nil {
			return desc, ocispec.Manifest{}, src.wrap("index "+reference, err)
		}
		child, err := artifact.ChoosePlatform(idx, ocispec.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH})
		if err != nil {
			return desc, ocispec.Manifest{}, src.wrap("index "+reference, err)
		}
		rc, err := src.Fetch(ctx, child)
		if err != nil {
			return desc, ocispec.Manifest{}, err
		}
		if b, err = readManifest(rc, child); err != nil {
			return desc, ocispec.Manifest{}, src.wrap("manifest "+child.Digest.String(), err)
		}
		desc = child
	case artifact.IsManifest(desc.MediaType):
	default:
		return desc, ocispec.Manifest{}, src.wrap("manifest "+reference, fmt.Errorf("unsupported manifest media type %q", desc.MediaType))
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return desc, m, src.wrap("manifest "+reference, err)
	}
	return desc, m, nil
}

// partialDir, under a fetch's target directory, holds the raw files an interrupted fetch had begun.
const partialDir = ".modelpack-partial"

func readManifest(rc io.ReadCloser, desc ocispec.Descriptor) ([]byte, error) {
	defer rc.Close()
	if err := artifact.CheckSize("manifest", desc); err != nil {
		return nil, err
	}
	b, err := cas.ReadAll(rc, desc.Digest, desc.Size)
	if err != nil {
		return nil, err
	}
	if err := artifact.CheckDocument(b); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	return b, nil
}

type fetcher struct {
	src      *Repository
	dir      string
	staging  string
	partials string // raw files being downloaded, kept across runs
	opts     FetchOptions
	t        *tracker
	claims   archive.Claims // the paths model layers write
}

// verifiedStream reads a layer through cas's verifier: its end is an error unless size and digest match. finish
// drains what the consumer left (tar padding after the end marker), so the check runs.
type verifiedStream struct {
	io.Reader
	rr *resumableReader
}

func (v *verifiedStream) finish() error {
	_, err := io.Copy(io.Discard, v)
	return err
}

// open starts reading a layer through its hash.
func (f *fetcher) open(ctx context.Context, desc ocispec.Descriptor) (*verifiedStream, error) {
	return f.openAt(ctx, desc, nil)
}

// openAt starts reading a layer where v, which has checked the bytes before it (a partial file's), stopped.
func (f *fetcher) openAt(ctx context.Context, desc ocispec.Descriptor, v *cas.Verifier) (*verifiedStream, error) {
	if err := desc.Digest.Validate(); err != nil {
		return nil, err
	}
	if v == nil {
		v = cas.NewVerifier(desc.Digest, desc.Size)
	}
	m := f.t.meter(desc, v.Written())
	rr := newResumableReader(ctx, desc, v.Written(), f.src.openBlob, m.add, f.src.opts.Timeouts)
	if err := rr.connect(); err != nil {
		return nil, err
	}
	return &verifiedStream{Reader: v.Reader(rr), rr: rr}, nil
}

// layer writes one model layer and returns the paths it wrote.
func (f *fetcher) layer(ctx context.Context, l artifact.Layer) ([]string, error) {
	files, err := f.writeLayer(ctx, l)
	if err != nil {
		f.t.finish(l.Descriptor, StatusFailed, err)
		return nil, f.src.wrap(subjectOf(l.Descriptor), err)
	}
	f.t.finish(l.Descriptor, StatusTransferred, nil)
	return files, nil
}

func (f *fetcher) writeLayer(ctx context.Context, l artifact.Layer) ([]string, error) {
	if l.Format == artifact.FormatRaw {
		return f.rawFile(ctx, l)
	}
	v, err := f.open(ctx, l.Descriptor)
	if err != nil {
		return nil, err
	}
	defer v.rr.Close()
	stage, err := os.MkdirTemp(f.staging, "layer-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage)
	aopts := f.opts.Archive
	aopts.KeepWhiteouts = false
	aopts.Size = l.Size
	if err := archive.Extract(v, l.Format, stage, aopts); err != nil {
		return nil, err
	}
	if err := v.finish(); err != nil {
		return nil, err
	}
	files, err := archive.FilesUnder(stage)
	if err != nil {
		return nil, err
	}
	if err := f.claims.Take(l, files); err != nil {
		return nil, err
	}
	return archive.MergeInto(stage, f.dir)
}

// rawFile streams a raw layer to a partial file and renames it to its path once the digest matches. The partial
// file (DIR/.modelpack-partial/<algorithm>-<hex>) outlives an interrupted fetch: the next one hashes what it
// holds and asks the registry for the rest only (HTTP Range), as pull's resumable ingest does. Bytes that do not
// verify are dropped.
func (f *fetcher) rawFile(ctx context.Context, l artifact.Layer) (_ []string, err error) {
	rel, err := archive.CleanPath(l.Path)
	if err != nil {
		return nil, err
	}
	if err := f.claims.Take(l, []string{rel}); err != nil {
		return nil, err
	}
	dst := filepath.Join(f.dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(f.partials, 0o755); err != nil {
		return nil, err
	}
	name := filepath.Join(f.partials, l.Digest.Algorithm().String()+"-"+l.Digest.Encoded())
	// Two fetches into one directory share a partial file: the second waits for the first.
	lock := flock.New(name + ".lock")
	if _, err := lock.TryLockContext(ctx, 50*time.Millisecond); err != nil {
		return nil, err
	}
	defer func() {
		lock.Unlock()
		os.Remove(name + ".lock")
	}()
	tmp, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	keep := false
	defer func() {
		if !keep {
			os.Remove(name)
		}
	}()
	held := cas.NewVerifier(l.Digest, l.Size)
	err = held.Resume(tmp)
	if err == nil {
		err = diskio.Preallocate(tmp, l.Size)
	}
	var v *verifiedStream
	if err == nil {
		v, err = f.openAt(ctx, l.Descriptor, held)
	}
	if err == nil {
		defer v.rr.Close()
		_, err = io.CopyBuffer(onlyWriter{tmp}, v, make([]byte, fileBufferSize))
		if err == nil {
			err = v.finish()
		}
	}
	if err == nil && f.opts.Sync {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// What arrived before an interruption is kept for the next run; bytes that failed their digest are not,
		// nor is a partial that holds nothing (a disk too full to reserve the file).
		fi, serr := os.Stat(name)
		keep = serr == nil && fi.Size() > 0 && !errors.Is(err, ErrDigestMismatch) && !errors.Is(err, ErrSizeMismatch)
		return nil, err
	}
	mode, mtime := fileMeta(l.Annotations)
	if f.opts.Archive.ReadOnly {
		mode &^= 0o222
	}
	if err := os.Chmod(tmp.Name(), mode); err != nil {
		return nil, err
	}
	if !mtime.IsZero() {
		_ = os.Chtimes(tmp.Name(), mtime, mtime)
	}
	// Through the destination's root: a symlink already there (an image layer's, say) is not followed out of it.
	root, err := os.OpenRoot(f.dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	tmpRel, err := filepath.Rel(f.dir, tmp.Name())
	keep = true // renamed below, or kept for the next run
	if err != nil {
		return nil, err
	}
	dst = filepath.FromSlash(rel)
	if err := root.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return nil, err
	}
	if fi, err := root.Lstat(dst); err == nil && fi.IsDir() {
		if err := root.RemoveAll(dst); err != nil {
			return nil, err
		}
	}
	if err := root.Rename(tmpRel, dst); err != nil {
		return nil, err
	}
	return []string{rel}, nil
}

// onlyWriter hides *os.File's ReadFrom so io.CopyBuffer uses our large buffer instead of the file's 32 KiB path.
type onlyWriter struct{ io.Writer }

// fileMeta reads a raw layer's mode and mtime from its file-metadata annotation (current or legacy name).
func fileMeta(ann map[string]string) (fs.FileMode, time.Time) {
	raw := ann[artifact.AnnotationFileMetadata]
	if raw == "" {
		raw = ann[artifact.LegacyAnnotationFileMetadata]
	}
	var md artifact.FileMetadata
	if raw == "" || json.Unmarshal([]byte(raw), &md) != nil || md.Mode == 0 {
		return 0o644, time.Time{}
	}
	return fs.FileMode(md.Mode) & 0o777, md.ModTime
}

// imageLayers applies container-image layers in order into one staging tree, each verified before the next, and
// moves the result into place.
func (f *fetcher) imageLayers(ctx context.Context, layers []artifact.Layer) ([]string, error) {
	stage, err := os.MkdirTemp(f.staging, "image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage)
	aopts := f.opts.Archive
	aopts.AbsoluteSymlinks = true
	for _, l := range layers {
		err := func() error {
			v, err := f.open(ctx, l.Descriptor)
			if err != nil {
				return err
			}
			defer v.rr.Close()
			aopts.Size = l.Size
			if err := archive.Extract(v, l.Format, stage, aopts); err != nil {
				return err
			}
			return v.finish()
		}()
		if err != nil {
			f.t.finish(l.Descriptor, StatusFailed, err)
			return nil, f.src.wrap(subjectOf(l.Descriptor), err)
		}
		f.t.finish(l.Descriptor, StatusTransferred, nil)
	}
	return archive.MergeInto(stage, f.dir)
}
