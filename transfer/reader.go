package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/internal/errdef"
)

// OpenFunc opens a blob at offset and says where its stream really starts: offset, or 0 when the source ignored
// the request for a range (the bytes before offset are then skipped).
type OpenFunc func(ctx context.Context, offset int64) (io.ReadCloser, int64, error)

// Endpoint is one place a blob can be read from.
type Endpoint struct {
	// Name names the endpoint in errors, logs and metrics (a mirror's host).
	Name string
	Open OpenFunc
}

// Request is one blob to read.
type Request struct {
	Digest digest.Digest
	Size   int64
	// Offset is where the read starts (the bytes before it are held already).
	Offset int64
	// Endpoints lists where to read from, in order, the last being the origin; it is asked at every connection,
	// so a source that learns of a lying endpoint (artifact/remote's Distrust) drops it from later reads.
	Endpoints func() []Endpoint
	// Retryable says whether an error of the origin is worth asking again; nil retries every error but
	// errdef's final ones (see Final).
	Retryable func(error) bool
	// OnRead is told of every chunk of bytes received (progress, accounting); may be nil.
	OnRead func(n int64)
	// OnServe is told which endpoint answered a connection; may be nil.
	OnServe func(endpoint string)
	// OnPass is told of an endpoint passed over for the rest of this read after err (a mirror's 5xx, refusal,
	// stall or cut); may be nil.
	OnPass func(endpoint string, err error)
}

// Final reports whether err is one asking again cannot change: the source says no (unauthorized, forbidden, not
// found) or the bytes are wrong (size or digest mismatch), or the disk is full.
func Final(err error) bool {
	for _, s := range []error{errdef.ErrUnauthorized, errdef.ErrForbidden, errdef.ErrNotFound, errdef.ErrSizeMismatch,
		errdef.ErrDigestMismatch, errdef.ErrNoSpace, errdef.ErrTooLarge, errdef.ErrUnsupported} {
		if errors.Is(err, s) {
			return true
		}
	}
	return errors.Is(err, context.Canceled)
}

// Reader reads exactly req.Size-req.Offset bytes of one blob from req's endpoints under a Policy, reconnecting
// after a dropped connection, a server restart or a stall and continuing from the byte it stopped at, so neither
// the bytes already read nor the consumer's state (a hash, a tar extraction) are lost. Checking the bytes is the
// consumer's job (cas.Verifier). A source that says the blob has another size, or whose stream ends cleanly
// before req.Size, fails at once with ErrSizeMismatch: the descriptor or the source lies.
type Reader struct {
	ctx context.Context
	req Request
	p   Policy

	offset   int64
	rc       io.ReadCloser
	cur      string // the endpoint read on
	curLast  bool   // it is the last one (the origin)
	cancel   context.CancelFunc
	watchdog Timer
	stalled  atomic.Bool // the watchdog cut the current attempt
	progress bool        // the current attempt delivered a byte
	passed   map[string]bool
	failures int
	resumes  int
	err      error
}

// NewReader returns a Reader of req that connects at its first Read.
func (p Policy) NewReader(ctx context.Context, req Request) *Reader {
	if req.OnRead == nil {
		req.OnRead = func(int64) {}
	}
	if req.Retryable == nil {
		req.Retryable = func(err error) bool { return !Final(err) }
	}
	return &Reader{ctx: ctx, req: req, p: p.OrDefault(), offset: req.Offset, passed: map[string]bool{}}
}

// Open returns a Reader of req that has connected: the error of a source that cannot serve it comes now.
func (p Policy) Open(ctx context.Context, req Request) (*Reader, error) {
	r := p.NewReader(ctx, req)
	if err := r.Connect(); err != nil {
		return nil, err
	}
	return r, nil
}

// Offset is the byte the next Read starts at.
func (r *Reader) Offset() int64 { return r.offset }

// errNoEndpoint is the error of a read whose every endpoint was passed over.
var errNoEndpoint = errors.New("no endpoint left to read from")

// Connect opens the blob at the current offset: from the first endpoint not passed over, moving to the next at
// once when one that is not the last fails, and retrying the last with backoff while its failures look
// transient. It is called by Read when needed; calling it first gives a source's error before any Read.
func (r *Reader) Connect() error {
	var lastPassed error
	for {
		if err := r.ctx.Err(); err != nil {
			return err
		}
		var eps []Endpoint
		for _, ep := range r.req.Endpoints() {
			if !r.passed[ep.Name] {
				eps = append(eps, ep)
			}
		}
		if len(eps) == 0 {
			if lastPassed == nil {
				lastPassed = errNoEndpoint
			}
			return fmt.Errorf("%w: %s: %w", errdef.ErrUnavailable, r.req.Digest, lastPassed)
		}
		for i, ep := range eps {
			last := i == len(eps)-1
			err := r.try(ep, last)
			if err == nil {
				return nil
			}
			if cerr := r.ctx.Err(); cerr != nil {
				return err
			}
			if !last {
				r.pass(ep.Name, err)
				lastPassed = err
				continue
			}
			r.failures++
			if !r.req.Retryable(err) {
				return err
			}
			if r.failures >= r.p.Attempts {
				return r.gaveUp(err)
			}
			if err := r.p.Clock.Sleep(r.ctx, r.p.Backoff(r.failures)); err != nil {
				return err
			}
		}
	}
}

// pass drops an endpoint for the rest of the read.
func (r *Reader) pass(name string, err error) {
	r.passed[name] = true
	if r.req.OnPass != nil {
		r.req.OnPass(name, err)
	}
}

// try makes one request to ep.
func (r *Reader) try(ep Endpoint, last bool) error {
	actx, cancel := context.WithTimeout(r.ctx, AttemptTimeout(r.req.Size-r.offset))
	// Waiting for the response is waiting for the first byte: it gets the idle limit.
	silent := r.p.Clock.AfterFunc(r.p.Idle, cancel)
	rc, start, err := ep.Open(actx, r.offset)
	if !silent.Stop() && err != nil && r.ctx.Err() == nil {
		err = fmt.Errorf("%w: %s: no response for %s (%v)", errdef.ErrUnavailable, r.req.Digest, r.p.Idle, err)
	}
	if err == nil && start != r.offset {
		// The server ignored the Range request: skip what is already held.
		if start > r.offset {
			err = fmt.Errorf("source of %s started at %d, past %d", r.req.Digest, start, r.offset)
		} else {
			_, err = io.CopyN(io.Discard, rc, r.offset-start)
		}
		if err != nil {
			rc.Close()
		}
	}
	if err != nil {
		cancel()
		return err
	}
	r.rc, r.cancel, r.progress, r.cur, r.curLast = rc, cancel, false, ep.Name, last
	r.stalled.Store(false)
	r.watchdog = r.p.Clock.AfterFunc(r.p.Idle, func() {
		r.stalled.Store(true)
		cancel()
	})
	if r.req.OnServe != nil {
		r.req.OnServe(ep.Name)
	}
	return nil
}

func (r *Reader) disconnect() {
	if r.rc != nil {
		r.watchdog.Stop()
		r.rc.Close()
		r.cancel()
		r.rc = nil
	}
}

func (r *Reader) Read(p []byte) (int, error) {
	for {
		if r.err != nil {
			return 0, r.err
		}
		rem := r.req.Size - r.offset
		if rem <= 0 {
			return 0, io.EOF
		}
		if int64(len(p)) > rem {
			p = p[:rem]
		}
		if r.rc == nil {
			if err := r.Connect(); err != nil {
				r.err = err
				return 0, err
			}
		}
		n, err := r.rc.Read(p)
		if n > 0 {
			r.offset += int64(n)
			r.failures = 0
			r.progress = true
			r.watchdog.Reset(r.p.Idle)
			r.req.OnRead(int64(n))
		}
		if err == nil || (err == io.EOF && r.offset == r.req.Size) {
			return n, nil
		}
		stalled := r.stalled.Load()
		r.disconnect()
		if cerr := r.ctx.Err(); cerr != nil {
			r.err = cerr
			return n, cerr
		}
		if err == io.EOF || errors.Is(err, errdef.ErrSizeMismatch) {
			// The source ended cleanly before Size (or said it holds another size): it has no more to give.
			if !errors.Is(err, errdef.ErrSizeMismatch) {
				err = fmt.Errorf("%s: %w: the source's stream ended at byte %d, the descriptor says %d", r.req.Digest, errdef.ErrSizeMismatch, r.offset, r.req.Size)
			}
			if !r.curLast {
				// A mirror that cuts a blob short is passed over; the next endpoint serves the rest.
				r.pass(r.cur, err)
				continue
			}
			r.err = err
			return n, err
		}
		// The stream broke: reconnect. Any error of the body (not of the caller's context) is a transport failure
		// worth resuming, including our own stall or time limit.
		if stalled {
			err = fmt.Errorf("%w: %s: no byte for %s", errdef.ErrUnavailable, r.req.Digest, r.p.Idle)
		}
		if !r.curLast {
			// A mirror that breaks off is passed over at once; the next endpoint continues from this byte.
			r.pass(r.cur, err)
		} else if !r.progress {
			// An attempt of the origin that moved nothing counts against Attempts, and the next waits.
			if r.failures++; r.failures >= r.p.Attempts {
				r.err = r.gaveUp(err)
				return n, r.err
			}
			if serr := r.p.Clock.Sleep(r.ctx, r.p.Backoff(r.failures)); serr != nil {
				r.err = serr
				return n, serr
			}
		}
		r.resumes++
		if r.resumes > r.p.MaxResumes {
			r.err = fmt.Errorf("%s: gave up after %d reconnections: %w", r.req.Digest, r.p.MaxResumes, err)
			return n, r.err
		}
		if n > 0 {
			return n, nil
		}
	}
}

// gaveUp is the final error of a read that made no progress in Attempts attempts: the last cause, classified as
// unavailable when it is nothing more precise.
func (r *Reader) gaveUp(last error) error {
	if !Final(last) && !errors.Is(last, errdef.ErrUnavailable) {
		last = fmt.Errorf("%w: %w", errdef.ErrUnavailable, last)
	}
	return fmt.Errorf("%s: gave up after %d attempts without a byte of progress: %w", r.req.Digest, r.p.Attempts, last)
}

// Close ends the read; a Read after it fails.
func (r *Reader) Close() error {
	r.disconnect()
	if r.err == nil {
		r.err = errors.New("read after close")
	}
	return nil
}
