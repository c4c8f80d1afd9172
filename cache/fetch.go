package cache

import (
	"context"
	"io"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
)

// Distruster is implemented by a source made of several endpoints (artifact/remote's Repository behind mirrors,
// a peer network): told that the bytes it last served of d did not match d, it stops reading d from the endpoint
// that sent them, names it, and reports whether another endpoint remains, so the cache fetches d again from there.
type Distruster interface {
	// Distrust names the endpoint passed over, and reports whether another remains.
	Distrust(d digest.Digest) (endpoint string, more bool)
}

// RangeFetcher is implemented by sources that can start a blob at an offset (an HTTP Range request). The cache
// uses it to resume a partial download; sources without it are read from the start, or seeked when their reader
// is an io.Seeker.
type RangeFetcher interface {
	// FetchRange returns the blob from offset, and the offset its reader really starts at (0 if the source
	// ignored the range).
	FetchRange(ctx context.Context, desc ocispec.Descriptor, offset int64) (io.ReadCloser, int64, error)
}

// openBlob opens desc from src at offset (or from 0 when the source cannot resume).
func openBlob(ctx context.Context, src oras.ReadOnlyTarget, desc ocispec.Descriptor, offset int64) (io.ReadCloser, int64, error) {
	if s, ok := src.(RangeFetcher); ok && offset > 0 {
		return s.FetchRange(ctx, desc, offset)
	}
	rc, err := src.Fetch(ctx, desc)
	if err != nil {
		return nil, 0, err
	}
	if s, ok := rc.(io.Seeker); ok && offset > 0 {
		if _, err := s.Seek(offset, io.SeekStart); err == nil {
			return rc, offset, nil
		}
	}
	return rc, 0, nil
}
