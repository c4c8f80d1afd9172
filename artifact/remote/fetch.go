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
	"sync"
	"syscall"
	"time"

	"github.com/gofrs/flock"
	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/archive"
	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/diskio"
	"github.com/modelpack/modelpack/transfer"
	digest "github.com/opencontainers/go-digest"
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
// resume with HTTP Range after a dropped connection. Raw layers that share a digest are downloaded once. It is all
// or nothing: on failure dir is as it was (a directory it created is removed), but that an interrupted or cut-off
// fetch keeps what it downloaded, verified or not yet, in DIR/.modelpack-partial for the next run.
func Fetch(ctx context.Context, src *Repository, dir string, opts FetchOptions) (*Result, error) {
	res, err := fetch(ctx, src, dir, opts)
	if err != nil {
		return nil, withOp("fetch", src, err)
	}
	res.Reference = src.Reference.String()
	return res, nil
}

func fetch(ctx context.Context, src *Repository, dir string, opts FetchOptions) (_ *Result, err error) {
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
	removeDir, err := archive.MakeDir(dir)
	if err != nil {
		return nil, err
	}
	// Every layer lands in a staging tree inside dir, moved into place only once all verified, all or nothing
	// (archive.MergeInto): a failed fetch leaves dir as it was, but for the downloads an interrupted one keeps aside.
	staging, err := os.MkdirTemp(dir, ".modelpack-fetch-")
	if err != nil {
		removeDir()
		return nil, err
	}
	partials := filepath.Join(dir, PartialDir)
	f := &fetcher{src: src, dir: dir, staging: staging, partials: partials, opts: opts, t: t}
	defer func() {
		if err != nil {
			f.abandon(err)
		}
		os.RemoveAll(staging)
		os.Remove(partials) // once empty: nothing left to resume
		if err != nil {
			removeDir()
		}
	}()
	conc := opts.Concurrency
	if conc <= 0 {
		conc = src.opts.concurrency()
	}
	// Model layers have disjoint paths (each claims its own: see claims): write them concurrently. Raw layers
	// that share a digest are one download, written once and copied. A layer that fails does not stop the
	// others, whose downloads are kept for the next run, but nothing lands.
	var tasks [][]artifact.Layer
	group := map[digest.Digest]int{}
	for _, l := range model {
		if i, ok := group[l.Digest]; ok && l.Format == artifact.FormatRaw {
			tasks[i] = append(tasks[i], l)
			continue
		}
		if l.Format == artifact.FormatRaw {
			group[l.Digest] = len(tasks)
		}
		tasks = append(tasks, []artifact.Layer{l})
	}
	stages := make([]string, len(tasks))
	wait := each(ctx, len(tasks), conc, func(i int) (err error) {
		stages[i], err = f.layer(ctx, tasks[i])
		return err
	})
	// Image layers stack, so they go one after the other into one staging tree, moved into place at the end.
	var imageErr error
	if len(image) > 0 {
		var st string
		st, imageErr = f.imageLayers(ctx, image)
		stages = append(stages, st)
	}
	errs := wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := joinBlobErrors(append(errs, imageErr)); err != nil {
		return nil, err
	}
	for _, st := range stages {
		if st == "" {
			continue
		}
		if _, err := archive.MergeInto(st, staging); err != nil {
			return nil, err
		}
		if err := os.RemoveAll(st); err != nil {
			return nil, err
		}
	}
	files, err := archive.MergeInto(staging, dir)
	if err != nil {
		return nil, err
	}
	f.placed = nil
	res := t.result("", root)
	res.Files = files
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

// PartialDir, under a fetch's target directory, holds the raw files an interrupted fetch had begun.
const PartialDir = ".modelpack-partial"

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

	mu sync.Mutex
	// placed are the verified downloads moved from partials into the staging tree: moved back if the fetch
	// fails, so the next run need not download them again.
	placed []placedFile
	begun  []string // partial files this run created
}

type placedFile struct{ staged, partial string }

// abandon handles the downloads of a failed fetch. One interrupted or cut off keeps them among the partial files
// (the verified ones moved back there), so the next run resumes; one that failed on the content (a blob that
// does not match its digest, paths that conflict, an unsafe archive) or on a full disk removes those this run
// began, since running it again as it is cannot succeed: the directory is left exactly as it was.
func (f *fetcher) abandon(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	content := false
	for _, e := range []error{ErrDigestMismatch, ErrSizeMismatch, artifact.ErrPathConflict, archive.ErrUnsafePath,
		archive.ErrLinkEscape, archive.ErrSpecialFile, archive.ErrTooLarge, syscall.ENOSPC, syscall.EDQUOT} {
		content = content || errors.Is(err, e)
	}
	if !content {
		for _, p := range f.placed {
			os.Rename(p.staged, p.partial)
		}
	} else {
		for _, name := range f.begun {
			os.Remove(name)
		}
	}
	f.placed, f.begun = nil, nil
}

// verifiedStream reads a layer through cas's verifier: its end is an error unless size and digest match. finish
// drains what the consumer left (tar padding after the end marker), so the check runs.
type verifiedStream struct {
	io.Reader
	rr *transfer.Reader
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
	rr := f.src.blobReader(ctx, desc, v.Written(), m.add)
	if err := rr.Connect(); err != nil {
		return nil, err
	}
	return &verifiedStream{Reader: v.Reader(rr), rr: rr}, nil
}

// layer writes one model layer (or raw layers sharing a digest) into a staging directory and returns it: a
// tar layer's own, "" for raw files, which go straight into the staging tree.
func (f *fetcher) layer(ctx context.Context, ls []artifact.Layer) (string, error) {
	stage, err := f.writeLayer(ctx, ls)
	for _, l := range ls {
		if err != nil {
			f.t.finish(l.Descriptor, StatusFailed, err)
		} else {
			f.t.finish(l.Descriptor, StatusTransferred, nil)
		}
	}
	if err != nil {
		return "", f.src.wrap(subjectOf(ls[0].Descriptor), err)
	}
	return stage, nil
}

func (f *fetcher) writeLayer(ctx context.Context, ls []artifact.Layer) (string, error) {
	l := ls[0]
	if l.Format == artifact.FormatRaw {
		return "", f.rawFile(ctx, ls)
	}
	v, err := f.open(ctx, l.Descriptor)
	if err != nil {
		return "", err
	}
	defer v.rr.Close()
	stage, err := os.MkdirTemp(f.staging, ".modelpack-layer-")
	if err != nil {
		return "", err
	}
	aopts := f.opts.Archive
	aopts.KeepWhiteouts = false
	aopts.Size = l.Size
	if err := archive.Extract(v, l.Format, stage, aopts); err != nil {
		return "", err
	}
	if err := v.finish(); err != nil {
		return "", err
	}
	files, err := archive.FilesUnder(stage)
	if err != nil {
		return "", err
	}
	if err := f.claims.Take(l, files); err != nil {
		return "", err
	}
	return stage, nil
}

// rawFile streams raw layers that share a digest to one partial file and, once the digest matches, moves it into
// the staging tree under the first layer's path and copies it to the others'. The partial file
// (DIR/.modelpack-partial/<algorithm>-<hex>) outlives an interrupted or failed fetch: the next one hashes what it
// holds and asks the registry for the rest only (HTTP Range), as pull's resumable ingest does. Bytes that do not
// verify are dropped.
func (f *fetcher) rawFile(ctx context.Context, ls []artifact.Layer) (err error) {
	l := ls[0]
	rels := make([]string, len(ls))
	for i, l := range ls {
		if rels[i], err = archive.CleanPath(l.Path); err != nil {
			return err
		}
		if rels[i] == "" {
			return fmt.Errorf("raw layer path %q names the model root: %w", l.Path, archive.ErrUnsafePath)
		}
		if err := f.claims.Take(l, []string{rels[i]}); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(f.partials, 0o755); err != nil {
		return err
	}
	name := filepath.Join(f.partials, l.Digest.Algorithm().String()+"-"+l.Digest.Encoded())
	// Two fetches into one directory share a partial file: the second waits for the first.
	lock := flock.New(name + ".lock")
	if _, err := lock.TryLockContext(ctx, 50*time.Millisecond); err != nil {
		return err
	}
	defer func() {
		lock.Unlock()
		os.Remove(name + ".lock")
	}()
	if _, err := os.Lstat(name); errors.Is(err, fs.ErrNotExist) {
		f.mu.Lock()
		f.begun = append(f.begun, name)
		f.mu.Unlock()
	}
	tmp, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
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
	complete := err == nil && held.Written() == l.Size
	switch {
	case complete:
		// A run interrupted after the whole file arrived kept it: nothing is left to ask for (a Range from its
		// end is refused), only its digest to check.
		err = held.Check()
	case err == nil:
		v, err = f.openAt(ctx, l.Descriptor, held)
	}
	if err == nil && !complete {
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
		return err
	}
	keep = true // verified: moved into the staging tree below, or kept for the next run
	root, err := os.OpenRoot(f.staging)
	if err != nil {
		return err
	}
	defer root.Close()
	// The copies first, from the verified file, then the file itself moves.
	for i := len(ls) - 1; i >= 0; i-- {
		rel := filepath.FromSlash(rels[i])
		if err := root.MkdirAll(filepath.Dir(rel), 0o755); err != nil {
			return err
		}
		if i > 0 {
			if err := copyInto(root, name, rel); err != nil {
				return err
			}
		} else {
			staged := filepath.Join(f.staging, rel)
			if err := os.Rename(name, staged); err != nil {
				return err
			}
			f.mu.Lock()
			f.placed = append(f.placed, placedFile{staged: staged, partial: name})
			f.mu.Unlock()
		}
		mode, mtime := fileMeta(ls[i].Annotations)
		if f.opts.Archive.ReadOnly {
			mode &^= 0o222
		}
		if err := root.Chmod(rel, mode); err != nil {
			return err
		}
		if !mtime.IsZero() {
			_ = root.Chtimes(rel, mtime, mtime)
		}
		if f.opts.Sync && i > 0 {
			if err := syncFile(root, rel); err != nil {
				return err
			}
		}
	}
	return nil
}

// copyInto copies the file at src to rel below root, a new file.
func copyInto(root *os.Root, src, rel string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := root.OpenFile(rel, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in) // copy_file_range: a reflink where the file system has them
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncFile(root *os.Root, rel string) error {
	f, err := root.Open(rel)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
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
// returns it.
func (f *fetcher) imageLayers(ctx context.Context, layers []artifact.Layer) (string, error) {
	stage, err := os.MkdirTemp(f.staging, ".modelpack-image-")
	if err != nil {
		return "", err
	}
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
			return "", f.src.wrap(subjectOf(l.Descriptor), err)
		}
		f.t.finish(l.Descriptor, StatusTransferred, nil)
	}
	return stage, nil
}
