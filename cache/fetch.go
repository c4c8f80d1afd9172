package cache

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
)

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
	if offset > 0 {
		switch s := src.(type) {
		case RangeFetcher:
			return s.FetchRange(ctx, desc, offset)
		case *remote.Repository:
			// oras-go's seekable blob reader would start a full GET and abandon it for a Range request: on a
			// fast link that moves megabytes for nothing. Ask for the range directly.
			return rangeGet(ctx, s, desc, offset)
		}
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

// rangeGet is GET /v2/<name>/blobs/<digest> with a Range header, through the repository's authenticating client.
func rangeGet(ctx context.Context, repo *remote.Repository, desc ocispec.Descriptor, offset int64) (io.ReadCloser, int64, error) {
	ref := repo.Reference
	ref.Reference = desc.Digest.String()
	ctx = auth.AppendRepositoryScope(ctx, ref, auth.ActionPull)
	scheme := "https"
	if repo.PlainHTTP {
		scheme = "http"
	}
	url := fmt.Sprintf("%s://%s/v2/%s/blobs/%s", scheme, ref.Host(), ref.Repository, desc.Digest)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
	var client remote.Client = auth.DefaultClient
	if repo.Client != nil {
		client = repo.Client
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	switch resp.StatusCode {
	case http.StatusPartialContent:
		var start int64
		if _, err := fmt.Sscanf(strings.TrimPrefix(resp.Header.Get("Content-Range"), "bytes "), "%d-", &start); err != nil || start != offset {
			resp.Body.Close()
			return nil, 0, fmt.Errorf("GET %s: range response starts at %q, want %d", url, resp.Header.Get("Content-Range"), offset)
		}
		return resp.Body, offset, nil
	case http.StatusOK:
		return resp.Body, 0, nil // the registry ignored the range: start over
	}
	resp.Body.Close()
	return nil, 0, fmt.Errorf("GET %s: %s", url, resp.Status)
}
