package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
)

// Time limits grow with layer size: a fixed limit either cuts off a 50 GiB shard on a slow link or leaves a hung
// small request waiting for many minutes.
const (
	baseTimeout = 2 * time.Minute
	minRate     = 1 << 20 // bytes per second below which an attempt is abandoned
	// maxResumes bounds the reconnections of one blob read, so a flapping link fails instead of looping.
	maxResumes = 100
	// maxPushAttempts is how many times an upload that cannot resume is started.
	maxPushAttempts = 5
)

// attemptTimeout is the time limit of one attempt to move n bytes.
func attemptTimeout(n int64) time.Duration {
	return baseTimeout + time.Duration(n/minRate)*time.Second
}

// backoff is the wait before retry number n (1-based): exponential from 250 ms, capped at 8 s, with ±10% jitter so
// concurrent layers do not retry in lockstep.
func backoff(n int) time.Duration {
	d := 250 * time.Millisecond << min(n-1, 5)
	d = min(d, 8*time.Second)
	jitter := time.Duration(rand.Int64N(int64(d)/5+1)) - d/10
	return d + jitter
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// blobOpener opens a blob at offset and says where its stream really starts (offset, or 0 when the source cannot
// seek).
type blobOpener func(ctx context.Context, desc ocispec.Descriptor, offset int64) (io.ReadCloser, int64, error)

// timeoutsOf returns the timeouts of src's reads: its Options' for a Repository, the defaults otherwise.
func timeoutsOf(src content.Fetcher) Timeouts {
	if r, ok := src.(*Repository); ok {
		return r.opts.Timeouts.orDefault()
	}
	return DefaultTimeouts
}

// openerFor returns how to open blobs of src: with Range requests and mirror fallback for a Repository, by seeking
// where the source can, from the start otherwise.
func openerFor(src content.Fetcher) blobOpener {
	if r, ok := src.(*Repository); ok {
		return r.openBlob
	}
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

// resumableReader reads a blob, reconnecting after a dropped connection, a server restart or a stall and continuing
// from the byte it stopped at (HTTP Range), so neither the bytes already read nor the consumer's state (a hash, a
// tar extraction) are lost. It delivers exactly desc.Size bytes; checking them is the consumer's job. A source that
// says the blob has another size, or whose stream ends cleanly before desc.Size, fails at once with ErrSizeMismatch:
// the descriptor or the source lies, and asking again cannot help. A source that stalls (no byte for tm.Idle) or
// fails tm.Attempts times in a row without a byte of progress fails with ErrUnavailable.
type resumableReader struct {
	ctx    context.Context
	desc   ocispec.Descriptor
	open   blobOpener
	onRead func(int64) // network bytes, for progress and accounting
	tm     Timeouts

	offset   int64
	rc       io.ReadCloser
	cancel   context.CancelFunc
	watchdog *time.Timer
	stalled  atomic.Bool // the watchdog cut the current attempt
	progress bool        // the current attempt delivered a byte
	failures int
	resumes  int
	err      error
}

// NewResumableReader reads desc.Size bytes of a source other than a registry (a file on the Hugging Face Hub) from
// offset, as blob reads are made: open is asked again from the byte a dropped or stalled stream stopped at, and
// its errors are retried or final as a registry's are (wrap ErrUnauthorized, ErrNotFound, … to make them final).
func NewResumableReader(ctx context.Context, desc ocispec.Descriptor, offset int64, open func(ctx context.Context, offset int64) (io.ReadCloser, int64, error), tm Timeouts) io.ReadCloser {
	return newResumableReader(ctx, desc, offset, func(ctx context.Context, _ ocispec.Descriptor, offset int64) (io.ReadCloser, int64, error) {
		return open(ctx, offset)
	}, nil, tm)
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

func newResumableReader(ctx context.Context, desc ocispec.Descriptor, offset int64, open blobOpener, onRead func(int64), tm Timeouts) *resumableReader {
	if onRead == nil {
		onRead = func(int64) {}
	}
	return &resumableReader{ctx: ctx, desc: desc, open: open, onRead: onRead, offset: offset, tm: tm.orDefault()}
}

// connect opens the blob at the current offset, retrying with backoff while the failures look transient.
func (r *resumableReader) connect() error {
	for {
		if err := r.ctx.Err(); err != nil {
			return err
		}
		actx, cancel := context.WithTimeout(r.ctx, attemptTimeout(r.desc.Size-r.offset))
		// Waiting for the response is waiting for the first byte: it gets the idle limit, not the longer
		// response-header limit of uploads.
		silent := time.AfterFunc(r.tm.Idle, cancel)
		rc, start, err := r.open(actx, r.desc, r.offset)
		if !silent.Stop() && err != nil && r.ctx.Err() == nil {
			err = fmt.Errorf("%w: %s: no response for %s (%v)", ErrUnavailable, r.desc.Digest, r.tm.Idle, err)
		}
		if err == nil && start != r.offset {
			// The server ignored the Range request: skip what is already held.
			if start > r.offset {
				err = fmt.Errorf("source of %s started at %d, past %d", r.desc.Digest, start, r.offset)
			} else {
				_, err = io.CopyN(io.Discard, rc, r.offset-start)
			}
			if err != nil {
				rc.Close()
			}
		}
		if err == nil {
			r.rc, r.cancel, r.progress = rc, cancel, false
			r.stalled.Store(false)
			r.watchdog = time.AfterFunc(r.tm.Idle, func() {
				r.stalled.Store(true)
				cancel()
			})
			return nil
		}
		cancel()
		r.failures++
		if !retryable(err) {
			return err
		}
		if r.failures >= r.tm.Attempts {
			return r.gaveUp(err)
		}
		if err := sleep(r.ctx, backoff(r.failures)); err != nil {
			return err
		}
	}
}

func (r *resumableReader) disconnect() {
	if r.rc != nil {
		r.watchdog.Stop()
		r.rc.Close()
		r.cancel()
		r.rc = nil
	}
}

func (r *resumableReader) Read(p []byte) (int, error) {
	for {
		if r.err != nil {
			return 0, r.err
		}
		rem := r.desc.Size - r.offset
		if rem <= 0 {
			return 0, io.EOF
		}
		if int64(len(p)) > rem {
			p = p[:rem]
		}
		if r.rc == nil {
			if err := r.connect(); err != nil {
				r.err = err
				return 0, err
			}
		}
		n, err := r.rc.Read(p)
		if n > 0 {
			r.offset += int64(n)
			r.failures = 0
			r.progress = true
			r.watchdog.Reset(r.tm.Idle)
			r.onRead(int64(n))
		}
		if err == nil || (err == io.EOF && r.offset == r.desc.Size) {
			return n, nil
		}
		stalled := r.stalled.Load()
		r.disconnect()
		if cerr := r.ctx.Err(); cerr != nil {
			r.err = cerr
			return n, cerr
		}
		if err == io.EOF || errors.Is(err, ErrSizeMismatch) {
			// The source ended cleanly before desc.Size (or said it holds another size): it has no more to give.
			if !errors.Is(err, ErrSizeMismatch) {
				err = fmt.Errorf("%s: %w: the source's stream ended at byte %d, the descriptor says %d", r.desc.Digest, ErrSizeMismatch, r.offset, r.desc.Size)
			}
			r.err = err
			return n, err
		}
		// The stream broke: reconnect at the next Read. Any error of the body (not of the caller's context) is a
		// transport failure worth resuming, including our own stall or time limit.
		if stalled {
			err = fmt.Errorf("%w: %s: no byte for %s", ErrUnavailable, r.desc.Digest, r.tm.Idle)
		}
		if !r.progress {
			// An attempt that moved nothing counts against Attempts, and the next waits.
			if r.failures++; r.failures >= r.tm.Attempts {
				r.err = r.gaveUp(err)
				return n, r.err
			}
			if serr := sleep(r.ctx, backoff(r.failures)); serr != nil {
				r.err = serr
				return n, serr
			}
		}
		r.resumes++
		if r.resumes > maxResumes {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			r.err = fmt.Errorf("%s: gave up after %d reconnections: %w", r.desc.Digest, maxResumes, err)
			return n, r.err
		}
		if n > 0 {
			return n, nil
		}
	}
}

// gaveUp is the final error of a read that made no progress in tm.Attempts attempts: the last cause, classified
// as unavailable when it is nothing more precise.
func (r *resumableReader) gaveUp(last error) error {
	if kindOf(last) == nil || kindOf(last) == ErrUnavailable {
		if !errors.Is(last, ErrUnavailable) {
			last = fmt.Errorf("%w: %w", ErrUnavailable, last)
		}
	}
	return fmt.Errorf("%s: gave up after %d attempts without a byte of progress: %w", r.desc.Digest, r.tm.Attempts, last)
}

func (r *resumableReader) Close() error {
	r.disconnect()
	if r.err == nil {
		r.err = errors.New("read after close")
	}
	return nil
}

// pushBlob uploads a blob, starting over with a fresh reader from open when an attempt fails (an upload cannot
// resume), with backoff between attempts.
func pushBlob(ctx context.Context, dst content.Pusher, desc ocispec.Descriptor, open func(ctx context.Context) (io.ReadCloser, error), m *meter) error {
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout(desc.Size))
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
		if !retryable(err) || attempt >= maxPushAttempts {
			return err
		}
		if err := sleep(ctx, backoff(attempt)); err != nil {
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
