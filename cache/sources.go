package cache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
)

// maxSources bounds the sources a pull collects from the callers that join it.
const maxSources = 8

// hedgeAfter is how long a read of a pull with more than one source may go without a byte before the next source
// is raced against it. It is far below a source's own idle limit: with another source at hand, a silent one is not
// waited for.
const hedgeAfter = 2 * time.Second

// sourceSet is every source offered for one pull: the starter's and those of the callers that joined it. The
// bytes are the same wherever they come from (they are checked against the digest), so each read is served by
// whichever source makes progress (see raceReader): a source that stalls cannot hold content that another caller
// can get from a healthy one, and a source that joins is raced at once against reads still waiting for their
// first byte. A source that fails is passed over; one that sends wrong bytes (a digest or size mismatch) is
// dropped for the rest of the pull, and the blob is fetched again from the next (see handOver).
type sourceSet struct {
	mu      sync.Mutex
	list    []oras.ReadOnlyTarget
	cur     int                      // the source reads start with: the last that delivered
	liars   map[int]bool             // sources that sent wrong bytes: never asked again
	errs    map[int]error            // each source's last failure, so a caller is told of its own source's
	served  map[digest.Digest]served // where each blob's last read came from
	readers map[*raceReader]struct{} // reads in progress, told when a source joins
	n       atomic.Int32             // len(list)
}

// served is the source of a blob read and the offset it started at.
type served struct {
	i     int
	start int64
}

func newSourceSet(src oras.ReadOnlyTarget) *sourceSet {
	s := &sourceSet{list: []oras.ReadOnlyTarget{src}, liars: map[int]bool{}, errs: map[int]error{},
		served: map[digest.Digest]served{}, readers: map[*raceReader]struct{}{}}
	s.n.Store(1)
	return s
}

// errAllLied ends a read when every source of the pull has sent wrong bytes.
var errAllLied = errors.New("every source of this pull sent bytes that do not match their descriptor")

// add offers another source and returns its index (-1 when the set is full). Sources are told apart by name
// where they have one (a repository's registry/name, with its credentials), so a caller retrying with a fresh
// client of the same repository does not pile up entries. Reads waiting for their first byte try a new source at
// once.
func (s *sourceSet) add(src oras.ReadOnlyTarget) int {
	s.mu.Lock()
	for i, have := range s.list {
		if have == src || (sourceName(have) != "" && sourceName(have) == sourceName(src)) {
			s.mu.Unlock()
			return i
		}
	}
	if len(s.list) >= maxSources {
		s.mu.Unlock()
		return -1
	}
	s.list = append(s.list, src)
	s.n.Store(int32(len(s.list)))
	i := len(s.list) - 1
	readers := make([]*raceReader, 0, len(s.readers))
	for r := range s.readers {
		readers = append(readers, r)
	}
	s.mu.Unlock()
	for _, r := range readers {
		r.joined()
	}
	return i
}

// errOf is source i's last failure in this pull, nil if it had none.
func (s *sourceSet) errOf(i int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errs[i]
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
		s.failed(i, err)
	}
}

// failed records err of source i and moves past it if it is the current one.
func (s *sourceSet) failed(i int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs[i] = err
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
func (c *Cache) handOver(src oras.ReadOnlyTarget, d digest.Digest, err error) (again, dropped bool) {
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
	// One endpoint of the source lied (a tampering mirror, a peer): the source reads d from its next one, and
	// stays. Either way the liar is named: an operator wants to know which mirror serves wrong bytes.
	if ds, ok := s.list[last.i].(Distruster); ok {
		if ep, more := ds.Distrust(d); more {
			c.lied(ep, d, err)
			return true, true
		}
	}
	c.lied(sourceName(s.list[last.i]), d, err)
	s.liars[last.i] = true
	s.errs[last.i] = err
	s.moveFrom(last.i)
	return len(s.liars) < len(s.list), true
}

// Fetch opens desc from whichever source delivers first (see raceReader).
func (s *sourceSet) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	rc, _, err := s.FetchRange(ctx, desc, 0)
	return rc, err
}

// FetchRange is Fetch from offset, for resuming (see RangeFetcher). It returns once a source delivered the first
// byte, or every source failed.
func (s *sourceSet) FetchRange(ctx context.Context, desc ocispec.Descriptor, offset int64) (io.ReadCloser, int64, error) {
	r := &raceReader{set: s, ctx: ctx, desc: desc, attempts: map[*attempt]bool{}, failed: map[int]error{},
		wake: make(chan struct{}, 1)}
	r.offset.Store(offset)
	s.mu.Lock()
	s.readers[r] = struct{}{}
	s.mu.Unlock()
	r.mu.Lock()
	err := r.race()
	r.mu.Unlock()
	if err != nil {
		r.Close()
		return nil, 0, err
	}
	return r, offset, nil
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

// sourcesError is a read that every source of a pull failed. Its message and cause are the last failure's; Cache.Pull
// tells each caller its own source's failure instead (sourceSet.errOf).
type sourcesError struct{ last error }

func (e *sourcesError) Error() string { return e.last.Error() }
func (e *sourcesError) Unwrap() error { return e.last }

// raceReader reads one blob (or manifest) from an offset for a pull, from whichever of its sources makes progress.
// A read starts with the set's current source; while it waits for its first byte, the next source is started too
// after hedgeAfter, and a source that joins the pull is started at once. The first to deliver a byte is read on
// and the others are cancelled. A source read on that then goes silent for hedgeAfter is challenged by the next
// source from the byte reached, and whichever delivers first goes on. With one source nothing is raced: the
// source's own limits (artifact/remote's idle timeout and attempts) apply alone, and a blob is downloaded once.
type raceReader struct {
	set  *sourceSet
	ctx  context.Context
	desc ocispec.Descriptor

	offset  atomic.Int64 // the next byte the consumer gets
	reading atomic.Int64 // when the consumer began waiting on cur (unix ns), 0 while it is not
	racing  atomic.Int32 // attempts started and not yet delivered or failed

	mu         sync.Mutex
	cur        *attempt // the attempt read on; only the consumer reads it
	won        *attempt // delivered first: the consumer takes it over next
	attempts   map[*attempt]bool
	inRound    map[int]bool  // sources started since the consumer last had no attempt to read
	failed     map[int]error // sources that failed this read
	lastErr    error
	lastLaunch time.Time
	joins      bool // a source joined since the race last looked
	closed     bool
	wake       chan struct{} // an attempt ended, or a source joined
	dog        *time.Timer
}

// attempt is one source's read of the blob from an offset.
type attempt struct {
	i      int
	from   int64
	rc     io.ReadCloser
	buf    []byte // read before the consumer took the attempt over
	cancel context.CancelFunc
	lost   bool // cancelled: its errors mean nothing
}

// raceChunk is how much an attempt reads to show it delivers.
const raceChunk = 64 << 10

// race makes r.won the attempt to read on, starting sources as described on raceReader; it is called with r.mu
// held and no current attempt.
func (r *raceReader) race() error {
	r.inRound, r.joins = map[int]bool{}, false
	var hedge *time.Timer
	defer func() {
		if hedge != nil {
			hedge.Stop()
		}
	}()
	for {
		if r.closed {
			return errors.New("read after close")
		}
		if err := r.ctx.Err(); err != nil {
			return err
		}
		if a := r.won; a != nil {
			r.won, r.cur = nil, a
			for b := range r.attempts {
				b.lost = true
				b.cancel()
			}
			clear(r.attempts)
			r.set.mu.Lock()
			r.set.cur = a.i
			r.set.served[r.desc.Digest] = served{i: a.i, start: a.from}
			r.set.mu.Unlock()
			return nil
		}
		due := len(r.attempts) == 0 || r.joins || time.Since(r.lastLaunch) >= hedgeAfter
		joins := r.joins
		r.joins = false
		for due && r.launchNext(-1) && joins {
			// a source that joined starts at once, with any other not tried yet
		}
		if len(r.attempts) == 0 {
			if len(r.failed) == 0 {
				return errAllLied
			}
			return &sourcesError{last: r.lastErr}
		}
		var tick <-chan time.Time
		if r.eligible(-1) >= 0 {
			wait := max(hedgeAfter-time.Since(r.lastLaunch), time.Millisecond)
			if hedge == nil {
				hedge = time.NewTimer(wait)
			} else {
				hedge.Reset(wait)
			}
			tick = hedge.C
		}
		r.mu.Unlock()
		select {
		case <-r.wake:
		case <-tick:
		case <-r.ctx.Done():
		}
		r.mu.Lock()
	}
}

// eligible is the next source to start, from the set's current one on: not a liar, not failed in this read, not
// started in this round and not skip; -1 if none is left.
func (r *raceReader) eligible(skip int) int {
	s := r.set
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range len(s.list) {
		i := (s.cur + k) % len(s.list)
		if i == skip || s.liars[i] || r.inRound[i] {
			continue
		}
		if _, bad := r.failed[i]; bad {
			continue
		}
		return i
	}
	return -1
}

// launchNext starts the next eligible source from the offset reached; false if none is left.
func (r *raceReader) launchNext(skip int) bool {
	i := r.eligible(skip)
	if i < 0 {
		return false
	}
	r.set.mu.Lock()
	src := r.set.list[i]
	r.set.mu.Unlock()
	ctx, cancel := context.WithCancel(r.ctx)
	a := &attempt{i: i, from: r.offset.Load(), cancel: cancel}
	r.attempts[a] = true
	r.inRound[i] = true
	r.lastLaunch = time.Now()
	r.racing.Add(1)
	go r.run(ctx, a, src)
	return true
}

// run opens a's source and reads its first chunk, then offers the attempt to the race.
func (r *raceReader) run(ctx context.Context, a *attempt, src oras.ReadOnlyTarget) {
	rc, start, err := openBlob(ctx, src, r.desc, a.from)
	var n int
	var buf []byte
	if err == nil && start != a.from {
		if start > a.from {
			err = fmt.Errorf("source of %s started at %d, past %d", r.desc.Digest, start, a.from)
		} else {
			_, err = io.CopyN(io.Discard, rc, a.from-start)
		}
	}
	if err == nil && a.from < r.desc.Size {
		buf = make([]byte, min(raceChunk, r.desc.Size-a.from))
		for n == 0 && err == nil {
			n, err = rc.Read(buf)
		}
		if err == io.EOF {
			err = nil // a short source is found out by its consumer (a size mismatch), as without a race
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.racing.Add(-1)
	delete(r.attempts, a)
	if a.lost || r.closed || r.ctx.Err() != nil {
		a.cancel()
		if rc != nil {
			rc.Close()
		}
		return
	}
	if err != nil {
		a.cancel()
		if rc != nil {
			rc.Close()
		}
		r.failed[a.i], r.lastErr = err, err
		r.set.failed(a.i, err)
		r.signal()
		return
	}
	a.rc, a.buf = rc, buf[:n]
	switch {
	case r.won != nil:
	case r.cur == nil:
		r.won = a
		r.signal()
		return
	case r.offset.Load() == a.from && r.reading.Load() != 0:
		// The attempt read on is still silent: this one takes over, and the consumer's wait ends.
		r.won = a
		r.cur.lost = true
		r.cur.cancel()
		return
	}
	a.lost = true
	a.cancel()
	rc.Close()
}

func (r *raceReader) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// joined is called when a source joins the pull: a race waiting for a first byte starts it at once; a read under
// way starts watching for silence.
func (r *raceReader) joined() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.joins = true
	if r.dog == nil && !r.closed {
		r.dog = time.AfterFunc(hedgeAfter/2, r.watch)
	}
	r.signal()
}

// watch challenges the attempt read on when it has been silent for hedgeAfter while another source may serve;
// it runs every hedgeAfter/2 for as long as the reader is open and the set has more than one source.
func (r *raceReader) watch() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	since := r.reading.Load()
	if r.cur != nil && r.won == nil && len(r.attempts) == 0 && since != 0 && time.Since(time.Unix(0, since)) >= hedgeAfter {
		r.inRound = map[int]bool{}
		r.launchNext(r.cur.i)
	}
	r.dog.Reset(hedgeAfter / 2)
}

func (r *raceReader) Read(p []byte) (int, error) {
	for {
		r.mu.Lock()
		a := r.cur
		if a == nil {
			if err := r.race(); err != nil {
				r.mu.Unlock()
				return 0, err
			}
			a = r.cur
		}
		if r.dog == nil && !r.closed && r.set.n.Load() > 1 {
			r.dog = time.AfterFunc(hedgeAfter/2, r.watch)
		}
		r.mu.Unlock()
		if skip := r.offset.Load() - a.from; skip > 0 {
			// The attempt that took over started before bytes the one it replaced still delivered.
			if err := a.skip(skip); err != nil {
				r.drop(a, err)
				continue
			}
		}
		if len(a.buf) > 0 {
			n := copy(p, a.buf)
			a.buf = a.buf[n:]
			a.from += int64(n)
			r.offset.Add(int64(n))
			return n, nil
		}
		r.reading.Store(time.Now().UnixNano())
		n, err := a.rc.Read(p)
		r.reading.Store(0)
		if n > 0 {
			a.from += int64(n)
			r.offset.Add(int64(n))
			if r.racing.Load() > 0 {
				r.dropChallengers()
			}
		}
		if err == nil || err == io.EOF {
			return n, err
		}
		r.drop(a, err)
		if n > 0 {
			return n, nil
		}
		if err := r.ctx.Err(); err != nil {
			return 0, err
		}
	}
}

// skip discards k bytes from a, already delivered by another source.
func (a *attempt) skip(k int64) error {
	if k <= int64(len(a.buf)) {
		a.buf = a.buf[k:]
		a.from += k
		return nil
	}
	k -= int64(len(a.buf))
	a.from += int64(len(a.buf))
	a.buf = nil
	m, err := io.CopyN(io.Discard, a.rc, k)
	a.from += m
	return err
}

// drop ends the attempt read on after err: a failure of its source unless it was cancelled in favour of another.
func (r *raceReader) drop(a *attempt, err error) {
	r.mu.Lock()
	if r.cur == a {
		r.cur = nil
	}
	if !a.lost && r.ctx.Err() == nil {
		r.failed[a.i], r.lastErr = err, err
		r.set.failed(a.i, err)
	}
	r.mu.Unlock()
	a.cancel()
	a.rc.Close()
}

// dropChallengers cancels the attempts racing the one read on, which just delivered.
func (r *raceReader) dropChallengers() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for a := range r.attempts {
		a.lost = true
		a.cancel()
	}
	clear(r.attempts)
}

func (r *raceReader) Close() error {
	r.set.mu.Lock()
	delete(r.set.readers, r)
	r.set.mu.Unlock()
	r.mu.Lock()
	r.closed = true
	if r.dog != nil {
		r.dog.Stop()
	}
	for a := range r.attempts {
		a.lost = true
		a.cancel()
	}
	clear(r.attempts)
	cur, won := r.cur, r.won
	r.cur, r.won = nil, nil
	r.mu.Unlock()
	for _, a := range []*attempt{cur, won} {
		if a != nil {
			a.cancel()
			a.rc.Close()
		}
	}
	return nil
}

// fetchSmall is fetchSmallOnce, with wrong bytes from one source of a joined pull handed over to the next as a
// blob's are (see handOver); each round drops a source, so it ends.
func (c *Cache) fetchSmall(ctx context.Context, src oras.ReadOnlyTarget, desc ocispec.Descriptor, what string) ([]byte, error) {
	if s, ok := src.(*sourceSet); ok {
		defer c.wantBlob(desc.Digest, s)()
	}
	for {
		b, err := c.fetchSmallOnce(ctx, src, desc, what)
		if again, dropped := c.handOver(src, desc.Digest, err); !again || !dropped || ctx.Err() != nil {
			return b, err
		}
	}
}

// wantBlob records that the pull of s fetches blob d until done is called. Pulls of different manifests (an index
// and its manifest, two models sharing a shard or a config) that fetch one blob at once share its download (cas
// coalesces ingests of a digest), whichever pull's read serves it: so they offer each other their sources, and the
// read is raced with them as with a caller's that joins (see raceReader). A stalling source of one pull then never
// holds the other.
func (c *Cache) wantBlob(d digest.Digest, s *sourceSet) (done func()) {
	v, _ := c.fetching.LoadOrStore(d, &blobWants{})
	w := v.(*blobWants)
	w.mu.Lock()
	others := append([]*sourceSet(nil), w.sets...)
	w.sets = append(w.sets, s)
	w.mu.Unlock()
	for _, t := range others {
		if t != s {
			t.offer(s)
			s.offer(t)
		}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			for i, t := range w.sets {
				if t == s {
					w.sets = append(w.sets[:i], w.sets[i+1:]...)
					break
				}
			}
			if len(w.sets) == 0 {
				c.fetching.CompareAndDelete(d, w)
			}
		})
	}
}

type blobWants struct {
	mu   sync.Mutex
	sets []*sourceSet
}

// offer adds the sources of o that did not send wrong bytes to s.
func (s *sourceSet) offer(o *sourceSet) {
	o.mu.Lock()
	var srcs []oras.ReadOnlyTarget
	for i, src := range o.list {
		if !o.liars[i] {
			srcs = append(srcs, src)
		}
	}
	o.mu.Unlock()
	for _, src := range srcs {
		s.add(src)
	}
}

// lied reports a source (or an endpoint of one) that sent bytes not matching d: a warning naming it and a count.
func (c *Cache) lied(source string, d digest.Digest, err error) {
	if source == "" {
		source = "a source of this pull"
	}
	c.m.lies.WithLabelValues(source).Inc()
	c.log.Warn("a source sent bytes that do not match their digest; reading them from the next", "source", source, "digest", d.String(), "error", err.Error())
}
