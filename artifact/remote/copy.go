package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/cas"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
)

// Ingester is a local store that takes a blob from a source it can reopen at an offset, keeping a partial blob
// across failures and even processes (cas.Store does). Pull uses it so an interrupted download resumes instead of
// starting over.
type Ingester interface {
	Ingest(ctx context.Context, d digest.Digest, size int64, open cas.OpenFunc) error
}

// blobDir is a store that hands out its cas.Store for resumable ingests (layout.Store does).
type blobDir interface {
	Blobs() (*cas.Store, error)
}

// ingesterOf returns how dst takes resumable ingests, if it does.
func ingesterOf(dst any) (Ingester, error) {
	if ing, ok := dst.(Ingester); ok {
		return ing, nil
	}
	if b, ok := dst.(blobDir); ok {
		return b.Blobs()
	}
	return nil, nil
}

// TransferOptions tune Push, Pull and Copy.
type TransferOptions struct {
	// Concurrency is how many blobs move at once; 0 takes the repository's Options.Concurrency.
	Concurrency int
	// Reporter, if set, receives per-blob progress.
	Reporter Reporter
	// Referrers also copies the artifacts that refer to the root (signatures, SBOMs), found through the OCI 1.1
	// referrers API or, on registries without it, the referrers tag.
	Referrers bool
	// Sources, if set, remembers which repositories of a registry hold each blob: a push asks the registry to
	// mount a blob from such a repository (POST ?mount=&from=) instead of sending it, and every transfer records
	// the registry's repository it pushed to or pulled from.
	Sources BlobSources
	// Sessions, if set, keeps the upload session of each large blob a push sends, so an interrupted push resumes
	// where the registry's copy stopped.
	Sessions UploadSessions
	// Check, if set, sees the root's blobs (config and layers) before any is copied; its error stops the transfer
	// with nothing written (pull checks the free space of its store with it).
	Check func([]ocispec.Descriptor) error
}

// BlobSources is where blobs were last seen in a registry (layout.Store keeps it beside the local store).
type BlobSources interface {
	BlobRepos(registry string, d digest.Digest) []string
	RecordBlobRepos(registry, repo string, ds []digest.Digest) error
}

// Push sends the artifact tagged srcRef in a local store (or any oras target) to dst, tagging it with dst's
// reference (srcRef's tag when dst names none). Blobs the registry already has are skipped after a HEAD request, so
// pushing the same model twice sends no layer bytes.
func Push(ctx context.Context, src oras.ReadOnlyTarget, srcRef string, dst *Repository, opts TransferOptions) (*Result, error) {
	dstRef := dst.Reference.Reference
	if dstRef == "" {
		return nil, fmt.Errorf("push %s: the destination needs a tag or digest", dst)
	}
	// A missing source is a local matter: say so rather than blame the registry.
	if _, err := src.Resolve(ctx, srcRef); err != nil {
		return nil, fmt.Errorf("push %s: %s is not in the local store: %w", dst, srcRef, err)
	}
	res, err := copyGraph(ctx, src, srcRef, dst, dstRef, dst, opts)
	if err != nil {
		return nil, withOp("push", dst, err)
	}
	res.Reference = dst.Reference.String()
	return res, nil
}

// Pull brings the artifact src names into a local store, tagging it there as dstRef. Blobs the store has are
// skipped; when the store is an Ingester, blob downloads resume where an earlier attempt stopped.
func Pull(ctx context.Context, src *Repository, dst oras.Target, dstRef string, opts TransferOptions) (*Result, error) {
	if src.Reference.Reference == "" {
		return nil, fmt.Errorf("pull %s: the reference needs a tag or digest", src)
	}
	res, err := copyGraph(ctx, src, src.Reference.Reference, dst, dstRef, src, opts)
	if err != nil {
		return nil, withOp("pull", src, err)
	}
	res.Reference = src.Reference.String()
	return res, nil
}

// Copy copies an artifact from one registry to another (or within one). Within one registry the blobs are mounted
// across repositories instead of transferred. The destination tag defaults to the source's.
func Copy(ctx context.Context, src, dst *Repository, opts TransferOptions) (*Result, error) {
	srcRef, dstRef, err := copyRefs(src, dst)
	if err != nil {
		return nil, err
	}
	res, err := copyGraph(ctx, src, srcRef, dst, dstRef, dst, opts)
	if err != nil {
		return nil, withOp("copy", dst, err)
	}
	ref := dst.Reference
	ref.Reference = dstRef
	res.Reference = ref.String()
	return res, nil
}

// withOp names the operation in err, and the registry when a lower layer did not.
// copyRefs are the references a copy from src to dst reads and writes: the source's tag or digest, and the
// destination's, which defaults to the source's.
func copyRefs(src, dst *Repository) (srcRef, dstRef string, err error) {
	srcRef = src.Reference.Reference
	if srcRef == "" {
		return "", "", fmt.Errorf("copy %s: the source needs a tag or digest", src)
	}
	dstRef = dst.Reference.Reference
	if dstRef == "" {
		dstRef = srcRef
	}
	return srcRef, dstRef, nil
}

func withOp(op string, repo *Repository, err error) error {
	var e *Error
	if errors.As(err, &e) {
		if e.Op == "" {
			e.Op = op
		}
		return err
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	return &Error{Op: op, Registry: repo.Reference.Registry, Repository: repo.Reference.Repository, Kind: kindOf(err), Err: err, Hints: repo.opts.Hints}
}

// copyGraph copies the artifact srcRef names in two phases. First every blob (configs and layers of the manifest,
// or of each manifest of an index), concurrently and independently: a blob that fails after its retries does not
// cancel the others, which complete and are kept, and all failures are reported together. Then oras-go copies the
// manifests (and, with Referrers, the referring artifacts) and tags the root; it finds the blobs in place. remote
// names the registry side in errors.
func copyGraph(ctx context.Context, src oras.ReadOnlyTarget, srcRef string, dst oras.Target, dstRef string, remote *Repository, opts TransferOptions) (*Result, error) {
	t := newTracker(opts.Reporter)
	ing, err := ingesterOf(dst)
	if err != nil {
		return nil, err
	}
	conc := opts.Concurrency
	if conc <= 0 {
		conc = remote.opts.concurrency()
	}
	root, err := src.Resolve(ctx, srcRef)
	if err != nil {
		return nil, err
	}
	blobs, err := collectBlobs(ctx, src, root)
	if err != nil {
		return nil, err
	}
	if opts.Check != nil {
		if err := opts.Check(blobs); err != nil {
			return nil, err
		}
	}
	mountFrom := ""
	s, srcIsRepo := src.(*Repository)
	d, dstIsRepo := dst.(*Repository)
	if srcIsRepo && dstIsRepo && s.Reference.Registry == d.Reference.Registry && s.Reference.Repository != d.Reference.Repository {
		mountFrom = s.Reference.Repository
	}
	errs := each(ctx, len(blobs), conc, func(i int) error {
		desc := blobs[i]
		from := mountFrom
		if from == "" && dstIsRepo && opts.Sources != nil {
			for _, r := range opts.Sources.BlobRepos(d.Reference.Registry, desc.Digest) {
				if r != d.Reference.Repository {
					from = r
					break
				}
			}
		}
		status, err := copyBlob(ctx, src, dst, ing, desc, from, t, opts.Sessions)
		if err != nil {
			t.finish(desc, StatusFailed, err)
			return remote.wrap(subjectOf(desc), err)
		}
		t.finish(desc, status, nil)
		return nil
	})()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := joinBlobErrors(errs); err != nil {
		return nil, err
	}
	if opts.Sources != nil {
		ds := make([]digest.Digest, len(blobs))
		for i, b := range blobs {
			ds[i] = b.Digest
		}
		// A hint for later pushes: failing to record it costs a later upload, never this transfer.
		_ = opts.Sources.RecordBlobRepos(remote.Reference.Registry, remote.Reference.Repository, ds)
	}

	g := oras.CopyGraphOptions{Concurrency: conc}
	// Blobs outside the root's own graph (those of referrers) are moved here, the same way.
	g.PreCopy = func(_ context.Context, desc ocispec.Descriptor) error {
		if isManifest(desc) {
			return nil
		}
		if err := transferBlob(ctx, src, dst, ing, desc, t, opts.Sessions); err != nil {
			t.finish(desc, StatusFailed, err)
			return remote.wrap(subjectOf(desc), err)
		}
		t.finish(desc, StatusTransferred, nil)
		return oras.SkipNode
	}
	rootRef := root.Digest.String()
	var placedDst oras.Target = dst
	if dstIsRepo {
		p := placed{Repository: d, blobs: make(map[digest.Digest]bool, len(blobs))}
		for _, b := range blobs {
			p.blobs[b.Digest] = true
		}
		placedDst = p
	}
	if gsrc, ok := src.(oras.ReadOnlyGraphTarget); ok && opts.Referrers {
		_, err = oras.ExtendedCopy(ctx, gsrc, rootRef, placedDst, dstRef, oras.ExtendedCopyOptions{
			ExtendedCopyGraphOptions: oras.ExtendedCopyGraphOptions{CopyGraphOptions: g},
		})
	} else {
		_, err = oras.Copy(ctx, src, rootRef, placedDst, dstRef, oras.CopyOptions{CopyGraphOptions: g})
	}
	if err != nil {
		return nil, unwrapCopyError(err)
	}
	if opts.Referrers {
		if err := copyCosignTags(ctx, src, dst, root, func(tag string) error {
			_, err := copyGraph(ctx, src, tag, dst, tag, remote, TransferOptions{Concurrency: conc, Reporter: opts.Reporter})
			return err
		}); err != nil {
			return nil, err
		}
	}
	return t.result("", root), nil
}

// placed is a destination whose blobs the first phase of a transfer made present: oras-go's copy of the manifests
// does not ask the registry again (a HEAD per blob, each a password check on a registry with basic auth).
// It is the Repository in all else (a ReferencePusher too: the root manifest goes up with its tag in one PUT).
type placed struct {
	*Repository
	blobs map[digest.Digest]bool
}

func (p placed) Exists(ctx context.Context, desc ocispec.Descriptor) (bool, error) {
	if p.blobs[desc.Digest] && !isManifest(desc) {
		return true, nil
	}
	return p.Repository.Exists(ctx, desc)
}

// cosignTagSuffixes are the tags cosign attaches to a manifest sha256:<hex> as sha256-<hex><suffix>: signatures,
// attestations and SBOMs. They refer to their subject by name only, so the referrers API does not find them;
// cosign copy carries them along, and so does copy -r.
var cosignTagSuffixes = []string{".sig", ".att", ".sbom"}

// copyCosignTags copies, with copyTag, every cosign tag src holds for root and, if root is an index, for each of
// its manifests.
func copyCosignTags(ctx context.Context, src oras.ReadOnlyTarget, dst oras.Target, root ocispec.Descriptor, copyTag func(tag string) error) error {
	subjects := []ocispec.Descriptor{root}
	if artifact.IsIndex(root.MediaType) {
		succ, err := content.Successors(ctx, src, root)
		if err != nil {
			return err
		}
		for _, s := range succ {
			if isManifest(s) {
				subjects = append(subjects, s)
			}
		}
	}
	for _, s := range subjects {
		for _, suffix := range cosignTagSuffixes {
			tag := s.Digest.Algorithm().String() + "-" + s.Digest.Encoded() + suffix
			if _, err := src.Resolve(ctx, tag); err != nil {
				if errors.Is(err, errdef.ErrNotFound) {
					continue
				}
				return err
			}
			if err := copyTag(tag); err != nil {
				return err
			}
		}
	}
	return nil
}

// joinBlobErrors reports the failed blobs together; a failure that is about the registry rather than one blob
// (credentials, TLS, a server that is no registry) is reported once.
func joinBlobErrors(errs []error) error {
	for _, err := range errs {
		switch Classify(err) {
		case ErrUnauthorized, ErrForbidden, ErrTLS, ErrNotOCI:
			return err
		}
		var e *Error
		if Unreachable(err) && errors.As(err, &e) {
			// The registry cannot be reached: no blob in particular failed.
			registryWide := *e
			registryWide.Subject = ""
			return &registryWide
		}
	}
	return errors.Join(errs...)
}

// collectBlobs lists the blobs under root (manifests walked, foreign layers left out), each once.
func collectBlobs(ctx context.Context, src content.Fetcher, root ocispec.Descriptor) ([]ocispec.Descriptor, error) {
	var out []ocispec.Descriptor
	seen := map[digest.Digest]bool{}
	var walk func(d ocispec.Descriptor) error
	walk = func(d ocispec.Descriptor) error {
		if seen[d.Digest] {
			return nil
		}
		seen[d.Digest] = true
		if !isManifest(d) {
			if !strings.Contains(d.MediaType, "foreign") {
				out = append(out, d)
			}
			return nil
		}
		if err := artifact.CheckSize("manifest", d); err != nil {
			return err
		}
		succ, err := content.Successors(ctx, src, d)
		if err != nil {
			return err
		}
		for _, s := range succ {
			if err := walk(s); err != nil {
				return err
			}
		}
		return nil
	}
	return out, walk(root)
}

// copyBlob makes one blob present in dst: nothing to do if it is there, a mount within one registry, a transfer
// otherwise.
func copyBlob(ctx context.Context, src content.Fetcher, dst content.Storage, ing Ingester, desc ocispec.Descriptor, mountFrom string, t *tracker, sessions UploadSessions) (Status, error) {
	ok, err := dst.Exists(ctx, desc)
	if err != nil {
		return "", err
	}
	if ok {
		return StatusExists, nil
	}
	if mountFrom != "" {
		if m, isMounter := dst.(*Repository); isMounter {
			uploaded := false
			err := m.Mount(ctx, desc, mountFrom, func() (io.ReadCloser, error) {
				// The registry could not mount: upload, counting the bytes.
				uploaded = true
				mt := t.meter(desc, 0)
				rr := blobReader(ctx, src, desc, 0, mt.add)
				if err := rr.Connect(); err != nil {
					return nil, err
				}
				return rr, nil
			})
			if err == nil {
				if uploaded {
					return StatusTransferred, nil
				}
				return StatusMounted, nil
			}
			if ctx.Err() != nil || !retryable(err) {
				return "", err
			}
			// A failed mount-with-upload falls through to a plain upload with retries.
		}
	}
	if err := transferBlob(ctx, src, dst, ing, desc, t, sessions); err != nil {
		return "", err
	}
	return StatusTransferred, nil
}

// unwrapCopyError drops oras-go's CopyError wrapper, whose text ("failed to perform "Push" on destination") says
// less than the error it wraps.
func unwrapCopyError(err error) error {
	var ce *oras.CopyError
	if errors.As(err, &ce) && ce.Err != nil {
		return ce.Err
	}
	return err
}

// transferBlob moves one blob: into an Ingester with resumption, from a local store to a registry through a
// resumable session when it is large and sessions are kept, to anything else with whole-blob retries.
func transferBlob(ctx context.Context, src content.Fetcher, dst content.Storage, ing Ingester, desc ocispec.Descriptor, t *tracker, sessions UploadSessions) error {
	open := openerFor(src)
	_, srcIsRepo := src.(*Repository)
	if r, ok := dst.(*Repository); ok && sessions != nil && desc.Size > resumableMin {
		return r.pushResumable(ctx, desc, func(ctx context.Context, offset int64) (io.ReadCloser, error) {
			if !srcIsRepo {
				return openAt(ctx, desc, offset, open)
			}
			// Another registry (copy): its download resumes too, from the byte the upload continues at.
			rr := blobReader(ctx, src, desc, offset, nil)
			if err := rr.Connect(); err != nil {
				return nil, err
			}
			return rr, nil
		}, t.meter(desc, 0), sessions)
	}
	if ing != nil {
		var m *meter
		err := ing.Ingest(ctx, desc.Digest, desc.Size, func(ictx context.Context, offset int64) (io.ReadCloser, int64, error) {
			m = t.meter(desc, offset)
			rr := blobReader(ictx, src, desc, offset, m.add)
			if err := rr.Connect(); err != nil {
				return nil, 0, err
			}
			return rr, offset, nil
		})
		if err != nil {
			return err
		}
		if m == nil {
			// Another process committed it while we waited for its lock.
			t.meter(desc, desc.Size)
		}
		return nil
	}
	m := t.meter(desc, 0)
	return pushBlob(ctx, dst, desc, func(actx context.Context) (io.ReadCloser, error) {
		if _, isRepo := src.(*Repository); !isRepo {
			// A local source needs no resumption.
			return src.Fetch(actx, desc)
		}
		rr := blobReader(actx, src, desc, 0, nil)
		if err := rr.Connect(); err != nil {
			return nil, err
		}
		return rr, nil
	}, m)
}
