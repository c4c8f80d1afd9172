package remote

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/modelpack/modelpack/cas"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
)

// Ingester is a local store that takes a blob from a source it can reopen at an offset, keeping a partial blob
// across failures and even processes (cas.Store does). Pull uses it so an interrupted download resumes instead of
// starting over.
type Ingester interface {
	Ingest(ctx context.Context, d digest.Digest, size int64, open cas.OpenFunc) error
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
}

// Push sends the artifact tagged srcRef in a local store (or any oras target) to dst, tagging it with dst's
// reference (srcRef's tag when dst names none). Blobs the registry already has are skipped after a HEAD request, so
// pushing the same model twice sends no layer bytes.
func Push(ctx context.Context, src oras.ReadOnlyTarget, srcRef string, dst *Repository, opts TransferOptions) (*Result, error) {
	dstRef := dst.Reference.Reference
	if dstRef == "" {
		return nil, fmt.Errorf("push %s: the destination needs a tag or digest", dst)
	}
	res, err := transfer(ctx, src, srcRef, dst, dstRef, dst, opts)
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
	res, err := transfer(ctx, src, src.Reference.Reference, dst, dstRef, src, opts)
	if err != nil {
		return nil, withOp("pull", src, err)
	}
	res.Reference = src.Reference.String()
	return res, nil
}

// Copy copies an artifact from one registry to another (or within one). Within one registry the blobs are mounted
// across repositories instead of transferred. The destination tag defaults to the source's.
func Copy(ctx context.Context, src, dst *Repository, opts TransferOptions) (*Result, error) {
	srcRef := src.Reference.Reference
	if srcRef == "" {
		return nil, fmt.Errorf("copy %s: the source needs a tag or digest", src)
	}
	dstRef := dst.Reference.Reference
	if dstRef == "" {
		dstRef = srcRef
	}
	res, err := transfer(ctx, src, srcRef, dst, dstRef, dst, opts)
	if err != nil {
		return nil, withOp("copy", dst, err)
	}
	ref := dst.Reference
	ref.Reference = dstRef
	res.Reference = ref.String()
	return res, nil
}

// withOp names the operation in err, and the registry when a lower layer did not.
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
	return &Error{Op: op, Registry: repo.Reference.Registry, Repository: repo.Reference.Repository, Kind: kindOf(err), Err: err}
}

// transfer copies the graph rooted at srcRef with oras-go, taking over the blobs (PreCopy) to add resumption,
// per-blob retries, progress and accounting; manifests are left to oras-go. remote names the registry side in
// errors.
func transfer(ctx context.Context, src oras.ReadOnlyTarget, srcRef string, dst oras.Target, dstRef string, remote *Repository, opts TransferOptions) (*Result, error) {
	t := newTracker(opts.Reporter)
	conc := opts.Concurrency
	if conc <= 0 {
		conc = remote.opts.concurrency()
	}
	g := oras.CopyGraphOptions{Concurrency: conc}
	g.OnCopySkipped = func(_ context.Context, desc ocispec.Descriptor) error {
		if !isManifest(desc) {
			t.finish(desc, StatusExists, nil)
		}
		return nil
	}
	g.PreCopy = func(_ context.Context, desc ocispec.Descriptor) error {
		if isManifest(desc) {
			return nil
		}
		// The caller's ctx, not oras-go's group ctx: a layer that fails after its retries must not cut short the
		// layers still in flight, whose bytes are then kept for the next attempt.
		if err := transferBlob(ctx, src, dst, desc, t); err != nil {
			t.finish(desc, StatusFailed, err)
			return remote.wrap(subjectOf(desc), err)
		}
		t.finish(desc, StatusTransferred, nil)
		return oras.SkipNode
	}
	s, srcIsRepo := src.(*Repository)
	d, dstIsRepo := dst.(*Repository)
	if srcIsRepo && dstIsRepo && s.Reference.Registry == d.Reference.Registry && s.Reference.Repository != d.Reference.Repository {
		g.MountFrom = func(context.Context, ocispec.Descriptor) ([]string, error) {
			return []string{s.Reference.Repository}, nil
		}
		g.OnMounted = func(_ context.Context, desc ocispec.Descriptor) error {
			t.finish(desc, StatusMounted, nil)
			return nil
		}
	}
	var root ocispec.Descriptor
	var err error
	if gsrc, ok := src.(oras.ReadOnlyGraphTarget); ok && opts.Referrers {
		root, err = oras.ExtendedCopy(ctx, gsrc, srcRef, dst, dstRef, oras.ExtendedCopyOptions{
			ExtendedCopyGraphOptions: oras.ExtendedCopyGraphOptions{CopyGraphOptions: g},
		})
	} else {
		root, err = oras.Copy(ctx, src, srcRef, dst, dstRef, oras.CopyOptions{CopyGraphOptions: g})
	}
	if err != nil {
		return nil, unwrapCopyError(err)
	}
	return t.result("", root), nil
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

// transferBlob moves one blob: into an Ingester with resumption, to anything else with whole-blob retries.
func transferBlob(ctx context.Context, src content.Fetcher, dst content.Storage, desc ocispec.Descriptor, t *tracker) error {
	open := openerFor(src)
	if ing, ok := dst.(Ingester); ok {
		var m *meter
		err := ing.Ingest(ctx, desc.Digest, desc.Size, func(ictx context.Context, offset int64) (io.ReadCloser, int64, error) {
			m = t.meter(desc, offset)
			rr := newResumableReader(ictx, desc, offset, open, m.add)
			if err := rr.connect(); err != nil {
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
		rr := newResumableReader(actx, desc, 0, open, nil)
		if err := rr.connect(); err != nil {
			return nil, err
		}
		return rr, nil
	}, m)
}
