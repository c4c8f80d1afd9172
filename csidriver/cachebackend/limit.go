package cachebackend

import (
	"context"
	"io"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/time/rate"
	"oras.land/oras-go/v2"

	"github.com/modelpack/modelpack/cache"
)

// limitedTarget shares one byte budget among every blob read through it, so background prepulls leave the
// node's link to the pods that are starting.
type limitedTarget struct {
	oras.ReadOnlyTarget
	lim *rate.Limiter
}

// newLimiter returns a limiter of bytesPerSecond, or nil for no limit. Its burst is a tenth of a second's worth
// (at least one read buffer) so throughput stays smooth without letting a burst exceed the limit by much.
func newLimiter(bytesPerSecond int64) *rate.Limiter {
	if bytesPerSecond <= 0 {
		return nil
	}
	burst := int(min(max(bytesPerSecond/10, 32<<10), 4<<20))
	return rate.NewLimiter(rate.Limit(bytesPerSecond), burst)
}

func (t limitedTarget) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	rc, err := t.ReadOnlyTarget.Fetch(ctx, desc)
	if err != nil {
		return nil, err
	}
	return &limitedReader{rc: rc, ctx: ctx, lim: t.lim}, nil
}

// FetchRange keeps the source's ranged reads, so the cache resumes an interrupted prepull of a large model where
// it stopped rather than from the start. A source without them is read from the start (offset 0 says so).
func (t limitedTarget) FetchRange(ctx context.Context, desc ocispec.Descriptor, offset int64) (io.ReadCloser, int64, error) {
	rf, ok := t.ReadOnlyTarget.(cache.RangeFetcher)
	if !ok {
		rc, err := t.Fetch(ctx, desc)
		return rc, 0, err
	}
	rc, start, err := rf.FetchRange(ctx, desc, offset)
	if err != nil {
		return nil, 0, err
	}
	return &limitedReader{rc: rc, ctx: ctx, lim: t.lim}, start, nil
}

var _ cache.RangeFetcher = limitedTarget{}

type limitedReader struct {
	rc  io.ReadCloser
	ctx context.Context
	lim *rate.Limiter
}

func (r *limitedReader) Read(p []byte) (int, error) {
	if b := r.lim.Burst(); len(p) > b {
		p = p[:b]
	}
	n, err := r.rc.Read(p)
	if n > 0 {
		if werr := r.lim.WaitN(r.ctx, n); werr != nil && err == nil {
			err = werr
		}
	}
	return n, err
}

func (r *limitedReader) Close() error { return r.rc.Close() }

// Distrust passes the cache's finding of wrong bytes on to the source, which may read from another endpoint.
func (t limitedTarget) Distrust(d digest.Digest) (string, bool) {
	if ds, ok := t.ReadOnlyTarget.(cache.Distruster); ok {
		return ds.Distrust(d)
	}
	return "", false
}
