package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"

	"github.com/modelpack/modelpack/transfer"
)

// blobOpener opens a blob at offset and says where its stream really starts (offset, or 0 when the source cannot
// seek).
type blobOpener func(ctx context.Context, desc ocispec.Descriptor, offset int64) (io.ReadCloser, int64, error)

// policyOf returns the transfer policy of src's reads: its Options' for a Repository, the defaults otherwise.
func policyOf(src any) transfer.Policy {
	if r, ok := src.(*Repository); ok {
		return r.opts.Timeouts.policy()
	}
	return DefaultTimeouts.policy()
}

// openerFor returns how to open blobs of src that is no Repository: by seeking where the source can, from the
// start otherwise.
func openerFor(src content.Fetcher) blobOpener {
	return func(ctx context.Context, desc ocispec.Descriptor, offset int64) (io.ReadCloser, int64, error) {
		rc, err := src.Fetch(ctx, desc)
		if err != nil {
			return nil, 0, err
		}
		if offset > 0 {
			if s, ok := rc.(io.Seeker); ok {
				if _, err := s.Seek(offset, io.SeekStart); err == nil {
					return rc, offset, nil
				}
			}
		}
		return rc, 0, nil
	}
}

// blobReader reads desc from offset through the transfer seam: from a Repository's endpoints, mirrors first
// (see Repository.blobRequest), from any other source as its one endpoint. onRead may be nil.
func blobReader(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor, offset int64, onRead func(int64)) *transfer.Reader {
	if r, ok := src.(*Repository); ok {
		return r.blobReader(ctx, desc, offset, onRead)
	}
	open := openerFor(src)
	return policyOf(src).NewReader(ctx, transfer.Request{Digest: desc.Digest, Size: desc.Size, Offset: offset, OnRead: onRead,
		Retryable: retryable, Endpoints: func() []transfer.Endpoint {
			return []transfer.Endpoint{{Name: fmt.Sprint(src), Open: func(ctx context.Context, offset int64) (io.ReadCloser, int64, error) {
				return open(ctx, desc, offset)
			}}}
		}})
}

// NewResumableReader reads desc.Size bytes of a source other than a registry (a file on the Hugging Face Hub) from
// offset, through the transfer seam under tm's policy: open is asked again from the byte a dropped or stalled
// stream stopped at, and its errors are retried or final as a registry's are (wrap ErrUnauthorized, ErrNotFound,
// … to make them final).
func NewResumableReader(ctx context.Context, desc ocispec.Descriptor, offset int64, open func(ctx context.Context, offset int64) (io.ReadCloser, int64, error), tm Timeouts) io.ReadCloser {
	return tm.policy().NewReader(ctx, transfer.Request{Digest: desc.Digest, Size: desc.Size, Offset: offset, Retryable: retryable,
		Endpoints: func() []transfer.Endpoint { return []transfer.Endpoint{{Name: "source", Open: open}} }})
}

// openAt opens a local blob at offset, skipping what a source that cannot seek gives before it.
func openAt(ctx context.Context, desc ocispec.Descriptor, offset int64, open blobOpener) (io.ReadCloser, error) {
	rc, start, err := open(ctx, desc, offset)
	if err != nil {
		return nil, err
	}
	if start > offset {
		rc.Close()
		return nil, fmt.Errorf("source of %s started at byte %d, past %d", desc.Digest, start, offset)
	}
	if _, err := io.CopyN(io.Discard, rc, offset-start); err != nil {
		rc.Close()
		return nil, err
	}
	return rc, nil
}

// pushBlob uploads a blob, starting over with a fresh reader from open when an attempt fails (an upload cannot
// resume), with backoff between attempts.
func pushBlob(ctx context.Context, dst content.Pusher, desc ocispec.Descriptor, open func(ctx context.Context) (io.ReadCloser, error), m *meter) error {
	p := policyOf(dst)
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, transfer.AttemptTimeout(desc.Size))
		rc, err := open(actx)
		if err == nil {
			m.rewind()
			err = dst.Push(actx, desc, &countingReader{r: rc, fn: m.add})
			rc.Close()
		}
		cancel()
		if err == nil || errors.Is(err, errdef.ErrAlreadyExists) {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !retryable(err) || attempt >= p.PushAttempts {
			return err
		}
		if err := p.Sleep(ctx, p.Backoff(attempt)); err != nil {
			return err
		}
	}
}

// countingReader reports every chunk read.
type countingReader struct {
	r  io.Reader
	fn func(int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.fn(int64(n))
	}
	return n, err
}

// each starts fn(i) for every i in [0, n), at most limit at a time, and returns a wait that gives every error by
// index. The items are independent: one that fails does not stop the others, so a broken layer cannot cancel the
// rest of a transfer.
func each(ctx context.Context, n, limit int, fn func(i int) error) (wait func() []error) {
	sem := make(chan struct{}, max(limit, 1))
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			defer func() { <-sem }()
			errs[i] = fn(i)
		}()
	}
	return func() []error {
		wg.Wait()
		return errs
	}
}
