package cache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
)

// maxSources bounds the sources a pull collects from the callers that join it.
const maxSources = 8

// sourceSet is every source offered for one pull: the starter's and those of the callers that joined it. The
// bytes are the same wherever they come from (they are checked against the digest), so a source that fails or
// stalls hands the pull to the next instead of failing it: a stalling registry cannot deny content that another
// caller can get from a healthy one.
type sourceSet struct {
	mu   sync.Mutex
	list []oras.ReadOnlyTarget
	cur  int
}

func newSourceSet(src oras.ReadOnlyTarget) *sourceSet {
	return &sourceSet{list: []oras.ReadOnlyTarget{src}}
}

// add offers another source. Sources are told apart by name where they have one (a repository's
// registry/name), so a caller retrying with a fresh client of the same repository does not pile up entries.
func (s *sourceSet) add(src oras.ReadOnlyTarget) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, have := range s.list {
		if have == src || (sourceName(have) != "" && sourceName(have) == sourceName(src)) {
			return
		}
	}
	if len(s.list) < maxSources {
		s.list = append(s.list, src)
	}
}

func sourceName(src oras.ReadOnlyTarget) string {
	if s, ok := src.(fmt.Stringer); ok {
		return s.String()
	}
	return ""
}

// each calls fn on the sources from the current one on, until one succeeds; a source that fails is passed over
// by later calls. It returns the last error.
func (s *sourceSet) each(ctx context.Context, fn func(i int, src oras.ReadOnlyTarget) error) error {
	s.mu.Lock()
	start := s.cur
	s.mu.Unlock()
	var err error
	for k := 0; ; k++ {
		s.mu.Lock()
		n := len(s.list)
		if k >= n {
			s.mu.Unlock()
			return err
		}
		i := (start + k) % n
		src := s.list[i]
		s.mu.Unlock()
		if err = fn(i, src); err == nil || ctx.Err() != nil {
			return err
		}
		s.failed(i)
	}
}

// failed moves past source i if it is the current one.
func (s *sourceSet) failed(i int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == i && len(s.list) > 1 {
		s.cur = (i + 1) % len(s.list)
	}
}

// Fetch opens desc from the first source that serves it; a read that breaks passes over that source next time.
func (s *sourceSet) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	rc, _, err := s.FetchRange(ctx, desc, 0)
	return rc, err
}

// FetchRange is Fetch from offset, for resuming (see RangeFetcher).
func (s *sourceSet) FetchRange(ctx context.Context, desc ocispec.Descriptor, offset int64) (io.ReadCloser, int64, error) {
	var out io.ReadCloser
	var start int64
	err := s.each(ctx, func(i int, src oras.ReadOnlyTarget) error {
		rc, st, err := openBlob(ctx, src, desc, offset)
		if err == nil {
			out, start = &sourceReader{rc: rc, set: s, i: i}, st
		}
		return err
	})
	return out, start, err
}

// Exists asks the sources in turn.
func (s *sourceSet) Exists(ctx context.Context, desc ocispec.Descriptor) (bool, error) {
	var ok bool
	err := s.each(ctx, func(_ int, src oras.ReadOnlyTarget) (err error) {
		ok, err = src.Exists(ctx, desc)
		return err
	})
	return ok, err
}

// Resolve asks the sources in turn.
func (s *sourceSet) Resolve(ctx context.Context, reference string) (ocispec.Descriptor, error) {
	var d ocispec.Descriptor
	err := s.each(ctx, func(_ int, src oras.ReadOnlyTarget) (err error) {
		d, err = src.Resolve(ctx, reference)
		return err
	})
	return d, err
}

// sourceReader marks its source as failed when its stream breaks (a stall, a cut connection, a lying size), so
// the retry resumes from the next source.
type sourceReader struct {
	rc  io.ReadCloser
	set *sourceSet
	i   int
}

func (r *sourceReader) Read(p []byte) (int, error) {
	n, err := r.rc.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, context.Canceled) {
		r.set.failed(r.i)
	}
	return n, err
}

func (r *sourceReader) Close() error { return r.rc.Close() }
