// Package transfer is the one way modelpack gets bytes of a blob from a source: an ordered list of endpoints
// (a registry's hosts.toml mirrors, then the origin; the Hugging Face Hub; later a node's P2P agent), read with
// one retry, backoff and stall policy (Policy), resumed from the byte a broken stream stopped at, and reported
// as it goes (Request's callbacks). What the bytes are is checked by the consumer with cas.Verifier (cas's
// ingest, artifact/remote's Fetch and Copy): the bytes of a mirror are worth no more than its word.
//
// Mirrors and the origin are not treated alike, as containerd treats them: an error of an endpoint that is not
// the last (a 5xx, a refused connection, a stall, a stream cut short) moves the read to the next endpoint at once,
// with no wait and no second try, and that endpoint is not asked again during this read. Retries and backoff
// belong to the last endpoint, the origin, which is the only one whose answer is authoritative.
//
// Worst case, for a read of a blob through M mirrors and an origin, with Policy p (A = p.Attempts, I = p.Idle):
//
//   - Without a byte of progress, the read makes at most M + A requests: one per mirror, A at the origin. It ends
//     with an error within (M + A)·I + Σ_{n=1}^{A-1} p.Backoff(n) (every endpoint stalls for the whole idle limit;
//     a refusal or a 5xx ends sooner). With the defaults (A = 8, I = 30 s, backoff 250 ms doubling to 8 s, ±10 %)
//     and no mirror: 8·30 s + 23.75 s·1.1 ≈ 4 min 26 s, and 8 requests.
//   - A read that does make progress reconnects at most p.MaxResumes times (each reconnection after progress
//     starts a new streak of at most A attempts at the origin); each attempt is also bounded by
//     p.AttemptTimeout of the bytes left, so a trickle cannot hold it for ever.
//
// No other layer retries a blob read: artifact/remote's registry clients read blobs without oras-go's
// per-request retries, and a mirror's client has none at all.
package transfer

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"time"

	"oras.land/oras-go/v2/registry/remote/retry"
)

// Policy is the one retry, backoff and stall policy of every download. The zero value of a field takes Default's.
type Policy struct {
	// Idle is how long an attempt may go without a byte (its response headers included) before it is abandoned:
	// a stall.
	Idle time.Duration
	// Attempts is how many consecutive attempts at the last endpoint may fail without a byte of progress before
	// the read gives up with the last cause.
	Attempts int
	// MaxResumes bounds the reconnections of one read, so a flapping link fails instead of looping.
	MaxResumes int
	// BackoffMin and BackoffMax bound the wait before a retry at the last endpoint: BackoffMin doubling, at most
	// BackoffMax, ±10 % jitter so concurrent reads do not retry in lockstep.
	BackoffMin, BackoffMax time.Duration
	// PushAttempts is how many times an upload that cannot resume is started (the upload sink's policy).
	PushAttempts int
	// Clock is the time source of waits and stall timers; nil is the real clock. Tests inject one to count the
	// time an error takes without waiting for it.
	Clock Clock
}

// Default is the policy of every registry and Hub read unless configured otherwise: a download is never silent
// for 30 s, and eight attempts with backoff ride out a registry restart.
var Default = Policy{Idle: 30 * time.Second, Attempts: 8, MaxResumes: 100, PushAttempts: 5, BackoffMin: 250 * time.Millisecond, BackoffMax: 8 * time.Second}

// Time limits of one attempt grow with its size: a fixed limit either cuts off a 50 GiB shard on a slow link or
// leaves a hung small request waiting for many minutes.
const (
	baseTimeout = 2 * time.Minute
	minRate     = 1 << 20 // bytes per second below which an attempt is abandoned
)

// OrDefault fills the zero fields of p from Default.
func (p Policy) OrDefault() Policy {
	if p.Idle <= 0 {
		p.Idle = Default.Idle
	}
	if p.Attempts <= 0 {
		p.Attempts = Default.Attempts
	}
	if p.MaxResumes <= 0 {
		p.MaxResumes = Default.MaxResumes
	}
	if p.BackoffMin <= 0 {
		p.BackoffMin = Default.BackoffMin
	}
	if p.BackoffMax <= 0 {
		p.BackoffMax = Default.BackoffMax
	}
	if p.PushAttempts <= 0 {
		p.PushAttempts = Default.PushAttempts
	}
	if p.Clock == nil {
		p.Clock = realClock{}
	}
	return p
}

// AttemptTimeout is the time limit of one attempt to move n bytes.
func AttemptTimeout(n int64) time.Duration {
	return baseTimeout + time.Duration(n/minRate)*time.Second
}

// Backoff is the wait before retry number n (1-based); see Policy.BackoffMin.
func (p Policy) Backoff(n int) time.Duration {
	p = p.OrDefault()
	d := p.BackoffMin << min(n-1, 20)
	d = min(d, p.BackoffMax)
	jitter := time.Duration(rand.Int64N(int64(d)/5+1)) - d/10
	return d + jitter
}

// MaxBackoffTotal is the longest Σ_{n=1}^{k} Backoff(n) can be (every jitter at +10 %): with Idle, the bound of
// the worst-case time to an error in the package comment.
func (p Policy) MaxBackoffTotal(k int) time.Duration {
	p = p.OrDefault()
	var sum time.Duration
	for n := 1; n <= k; n++ {
		d := min(p.BackoffMin<<min(n-1, 20), p.BackoffMax)
		sum += d + d/10
	}
	return sum
}

// Sleep waits for d on p's clock, or until ctx ends.
func (p Policy) Sleep(ctx context.Context, d time.Duration) error {
	return p.OrDefault().Clock.Sleep(ctx, d)
}

// RequestRetry is the retry of one request that is no blob read, at the origin only (a manifest, a token, a
// referrers list, a step of an upload): oras-go's retry transport, on 5xx, 429, resets and dial timeouts, except
// for a registry that does not answer in time (the callers bound those with the idle limit, so a stalling
// registry fails in Attempts×Idle and not six times that). A mirror's requests are never retried (see the package
// comment), and neither are blob reads, whose retries are Policy's.
var RequestRetry retry.Policy = &retry.GenericPolicy{
	Retryable: func(resp *http.Response, err error) (bool, error) {
		var ne net.Error
		var op *net.OpError
		if errors.As(err, &ne) && ne.Timeout() && !(errors.As(err, &op) && op.Op == "dial") {
			return false, err
		}
		return retry.DefaultPredicate(resp, err)
	},
	Backoff:  retry.DefaultBackoff,
	MinWait:  200 * time.Millisecond,
	MaxWait:  3 * time.Second,
	MaxRetry: 5,
}

// Clock is what a Policy waits with.
type Clock interface {
	// AfterFunc calls f in its own goroutine after d, unless the timer is stopped first.
	AfterFunc(d time.Duration, f func()) Timer
	// Sleep waits for d, or until ctx ends (then it returns ctx.Err()).
	Sleep(ctx context.Context, d time.Duration) error
}

// Timer is a Clock's AfterFunc timer.
type Timer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

type realClock struct{}

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

func (realClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
