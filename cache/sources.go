package cache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
)

// maxSources bounds the sources a pull collects from the callers that join it.
const maxSources = 8

// sourceSet is every source offered for one pull: the starter's and those of the callers that joined it. The
// bytes are the same wherever they come from (they are checked against the digest), so a source that fails or
// stalls hands the pull to the next instead of failing it: a stalling registry cannot deny content that another
// caller can get from a healthy one. A source that sends wrong bytes (a digest or size mismatch) is dropped for
// the rest of the pull, and the blob is fetched again from the next (see handOver).
type sourceSet struct {
	mu     sync.Mutex
	list   []oras.ReadOnlyTarget
	cur    int
	liars  map[int]bool             // sources that sent wrong bytes: never asked again
	served map[digest.Digest]served // where each blob's last read came from
}

// served is the source of a blob read and the offset it started at.
type served struct {
	i     int
	start int64
}

func newSourceSet(src oras.ReadOnlyTarget) *sourceSet {
	return &sourceSet{list: []oras.ReadOnlyTarget{src}, liars: map[int]bool{}, served: map[digest.Digest]served{}}
}

// errAllLied ends a read when every source of the pull has sent wrong bytes.
var errAllLied = errors.New("every source of this pull sent bytes that do not match their descriptor")

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

// each calls fn on the sources from the current one on, until one succeeds, skipping those that sent wrong bytes;
// a source that fails is passed over by later calls. It returns the last error.
func (s *sourceSet) each(ctx context.Context, fn func(i int, src oras.ReadOnlyTarget) error) error {
	s.mu.Lock()
	start := s.cur
	s.mu.Unlock()
	err := errAllLied
	for k := 0; ; k++ {
		s.mu.Lock()
		n := len(s.list)
		if k >= n {
			s.mu.Unlock()
			return err
		}
		i := (start + k) % n
		src, liar := s.list[i], s.liars[i]
		s.mu.Unlock()
		if liar {
			continue
		}
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
	s.moveFrom(i)
}

func (s *sourceSet) moveFrom(i int) {
	if s.cur == i && len(s.list) > 1 {
		s.cur = (i + 1) % len(s.list)
	}
}

// handOver is called when a fetch of blob d failed with err. It reports whether to fetch d again because its bytes
// did not match the descriptor (a size or digest mismatch): when one source sent the whole stream, that source is
// dropped for the rest of the pull (dropped) and the fetch goes again while another remains; when the stream
// resumed a partial, perhaps another source's, the liar is unknown and the blob is fetched again once more, from the
// start if cas dropped the partial. It is false for any other error, a src that is no sourceSet, or a blob this
// set did not serve.
func handOver(src oras.ReadOnlyTarget, d digest.Digest, err error) (again, dropped bool) {
	s, ok := src.(*sourceSet)
	if !ok || !(errors.Is(err, ErrDigestMismatch) || errors.Is(err, ErrSizeMismatch)) {
		return false, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	last, ok := s.served[d]
	if !ok {
		return false, false
	}
	delete(s.served, d)
	if last.start != 0 {
		return true, false
	}
	s.liars[last.i] = true
	s.moveFrom(last.i)
	return len(s.liars) < len(s.list), true
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
			s.mu.Lock()
			s.served[desc.Digest] = served{i: i, start: st}
			s.mu.Unlock()
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

// fetchSmall is fetchSmallOnce, with wrong bytes from one source of a joined pull handed over to the next as a
// blob's are (see handOver); each round drops a source, so it ends.
func (c *Cache) fetchSmall(ctx context.Context, src oras.ReadOnlyTarget, desc ocispec.Descriptor, what string) ([]byte, error) {
	for {
		b, err := c.fetchSmallOnce(ctx, src, desc, what)
		if again, dropped := handOver(src, desc.Digest, err); !again || !dropped || ctx.Err() != nil {
			return b, err
		}
	}
}
