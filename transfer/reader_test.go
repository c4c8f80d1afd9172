package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/internal/errdef"
)

// fakeClock is a Clock whose time moves only when a read waits (Sleep) or a hostile server says it is stalling
// (stall): a test counts the time an error takes, and never waits for it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Duration
	timers map[*fakeTimer]bool
	slept  time.Duration
}

type fakeTimer struct {
	c        *fakeClock
	deadline time.Duration
	d        time.Duration
	f        func()
}

func newFakeClock() *fakeClock { return &fakeClock{timers: map[*fakeTimer]bool{}} }

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, deadline: c.now + d, d: d, f: f}
	c.timers[t] = true
	return t
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.now += d
	c.slept += d
	c.mu.Unlock()
	return ctx.Err()
}

// stall moves the time to the first pending deadline and fires the timers due: what a server that says nothing
// does to the reader's stall limit.
func (c *fakeClock) stall() {
	c.mu.Lock()
	var next time.Duration = -1
	for t := range c.timers {
		if next < 0 || t.deadline < next {
			next = t.deadline
		}
	}
	var due []func()
	if next >= 0 {
		c.now = max(c.now, next)
		for t := range c.timers {
			if t.deadline <= c.now {
				delete(c.timers, t)
				due = append(due, t.f)
			}
		}
	}
	c.mu.Unlock()
	for _, f := range due {
		go f()
	}
}

func (c *fakeClock) elapsed() (now, slept time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now, c.slept
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.c.timers[t]
	delete(t.c.timers, t)
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.c.timers[t]
	t.deadline, t.d = t.c.now+d, d
	t.c.timers[t] = true
	return was
}

// fault is what a hostile endpoint does to every request.
type fault string

const (
	healthy      fault = "healthy"
	serverError  fault = "500"
	refused      fault = "refused"
	stallHeaders fault = "stall-headers"
	stallBody    fault = "stall-body"
	cutBody      fault = "cut-body"
)

// endpointServer is a blob server on loopback that counts its requests and behaves as its fault says.
type endpointServer struct {
	name     string
	mu       sync.Mutex
	fault    fault
	blob     []byte
	clock    *fakeClock
	requests atomic.Int32
	ranges   chan string // the Range header of each request
	url      string
}

func startEndpoint(t *testing.T, name string, f fault, blob []byte, clock *fakeClock) *endpointServer {
	t.Helper()
	e := &endpointServer{name: name, fault: f, blob: blob, clock: clock, ranges: make(chan string, 64)}
	if f == refused {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		e.url = "http://" + ln.Addr().String()
		ln.Close() // nothing listens there now: the connection is refused
		return e
	}
	srv := httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return e
}

func (e *endpointServer) serve(w http.ResponseWriter, r *http.Request) {
	e.requests.Add(1)
	e.ranges <- r.Header.Get("Range")
	off := int64(0)
	if rg := r.Header.Get("Range"); rg != "" {
		off, _ = strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(rg, "bytes="), "-"), 10, 64)
	}
	body := e.blob[off:]
	e.mu.Lock()
	f := e.fault
	e.mu.Unlock()
	switch f {
	case serverError:
		http.Error(w, "broken", http.StatusInternalServerError)
		return
	case stallHeaders:
		e.clock.stall()
		<-r.Context().Done()
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	if off > 0 {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, len(e.blob)-1, len(e.blob)))
		w.WriteHeader(http.StatusPartialContent)
	}
	switch f {
	case stallBody:
		w.Write(body[:len(body)/2])
		w.(http.Flusher).Flush()
		e.clock.stall()
		<-r.Context().Done()
	case cutBody:
		w.Write(body[:len(body)/2])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	default:
		w.Write(body)
	}
}

// open is the endpoint's OpenFunc: a GET with a Range from offset, an error for any status but 200 and 206.
func (e *endpointServer) open(ctx context.Context, offset int64) (io.ReadCloser, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url+"/blob", nil)
	if err != nil {
		return nil, 0, err
	}
	if offset > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, 0, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return resp.Body, 0, nil
	case http.StatusPartialContent:
		return resp.Body, offset, nil
	}
	resp.Body.Close()
	return nil, 0, fmt.Errorf("%s: %w: HTTP %d", e.name, errdef.ErrUnavailable, resp.StatusCode)
}

func endpoints(es ...*endpointServer) func() []Endpoint {
	return func() []Endpoint {
		var out []Endpoint
		for _, e := range es {
			out = append(out, Endpoint{Name: e.name, Open: e.open})
		}
		return out
	}
}

func testBlob() ([]byte, digest.Digest) {
	b := bytes.Repeat([]byte("modelpack transfer "), 1<<14)
	return b, digest.FromBytes(b)
}

// A mirror's error of any kind (a 5xx, a refused connection, a stall before or during the body, a stream cut
// short) moves the read to the next endpoint at once: one request to the mirror, no wait, and the read completes
// from the origin with the right bytes, resuming at the byte the mirror stopped at. The mirror is named to
// OnPass.
func TestMirrorErrorMovesToTheNextEndpointAtOnce(t *testing.T) {
	blob, d := testBlob()
	for _, f := range []fault{serverError, refused, stallHeaders, stallBody, cutBody} {
		t.Run(string(f), func(t *testing.T) {
			clock := newFakeClock()
			mirror := startEndpoint(t, "mirror", f, blob, clock)
			origin := startEndpoint(t, "origin", healthy, blob, clock)
			var passed []string
			p := Policy{Idle: 30 * time.Second, Attempts: 8, Clock: clock}
			r := p.NewReader(context.Background(), Request{Digest: d, Size: int64(len(blob)), Endpoints: endpoints(mirror, origin),
				OnPass: func(ep string, err error) { passed = append(passed, ep) }})
			got, err := io.ReadAll(r)
			r.Close()
			if err != nil {
				t.Fatalf("a read whose mirror answers %s: %v", f, err)
			}
			if !bytes.Equal(got, blob) {
				t.Fatalf("the read delivered %d bytes, not the blob's %d", len(got), len(blob))
			}
			if f != refused {
				if n := mirror.requests.Load(); n != 1 {
					t.Fatalf("the mirror was asked %d times, want once", n)
				}
			}
			if n := origin.requests.Load(); n != 1 {
				t.Fatalf("the origin was asked %d times, want once", n)
			}
			if _, slept := clock.elapsed(); slept != 0 {
				t.Fatalf("the read waited %s before leaving the mirror, want no wait", slept)
			}
			if len(passed) != 1 || passed[0] != "mirror" {
				t.Fatalf("passed over %v, want the mirror", passed)
			}
			if f == stallBody || f == cutBody {
				if rg := <-origin.ranges; rg == "" {
					t.Log("the mirror's bytes never reached the reader before the cut; the origin served the whole blob")
				}
			}
		})
	}
}

// The worst case of the package comment, measured: through M mirrors that fail (a 500 and a stall) to an origin
// that never answers, a read makes exactly M + Attempts requests, and ends with ErrUnavailable after at most
// (M + Attempts)·Idle + MaxBackoffTotal(Attempts-1) of the read's clock, and no sooner than the stalls and the
// shortest backoffs add up to.
func TestWorstCaseAttemptsAndTimeToAnError(t *testing.T) {
	blob, d := testBlob()
	clock := newFakeClock()
	m1 := startEndpoint(t, "mirror-500", serverError, blob, clock)
	m2 := startEndpoint(t, "mirror-stall", stallHeaders, blob, clock)
	origin := startEndpoint(t, "origin", stallHeaders, blob, clock)
	const mirrors, attempts, idle = 2, 5, 30 * time.Second
	p := Policy{Idle: idle, Attempts: attempts, Clock: clock}
	_, err := p.Open(context.Background(), Request{Digest: d, Size: int64(len(blob)), Endpoints: endpoints(m1, m2, origin)})
	if !errors.Is(err, errdef.ErrUnavailable) || !strings.Contains(err.Error(), "gave up after 5 attempts") {
		t.Fatalf("a read of an origin that never answers: %v, want unavailable after 5 attempts", err)
	}
	if n1, n2, no := m1.requests.Load(), m2.requests.Load(), origin.requests.Load(); n1 != 1 || n2 != 1 || no != attempts {
		t.Fatalf("requests: mirror-500 %d, mirror-stall %d, origin %d; want 1, 1, %d", n1, n2, no, attempts)
	}
	now, slept := clock.elapsed()
	stalls := time.Duration(1+attempts) * idle // the 500 costs no time
	worst := time.Duration(mirrors+attempts)*idle + p.MaxBackoffTotal(attempts-1)
	var least time.Duration
	for n := 1; n < attempts; n++ {
		d := min(p.OrDefault().BackoffMin<<(n-1), p.OrDefault().BackoffMax)
		least += d - d/10
	}
	if now > worst || now < stalls+least {
		t.Fatalf("the error came after %s (%s of backoff), want between %s and the stated worst case %s", now, slept, stalls+least, worst)
	}
}

// The origin's transient errors are retried with backoff (it is the last endpoint), and a stream it cuts short
// resumes with a Range request from the byte reached.
func TestOriginIsRetriedAndResumed(t *testing.T) {
	blob, d := testBlob()
	clock := newFakeClock()
	origin := startEndpoint(t, "origin", serverError, blob, clock)
	var fails atomic.Int32
	flaky := func(ctx context.Context, offset int64) (io.ReadCloser, int64, error) {
		if fails.Add(1) <= 2 {
			return origin.open(ctx, offset) // a 500
		}
		origin.mu.Lock()
		origin.fault = cutBody
		if fails.Load() > 3 {
			origin.fault = healthy
		}
		origin.mu.Unlock()
		return origin.open(ctx, offset)
	}
	p := Policy{Idle: 30 * time.Second, Attempts: 3, Clock: clock}
	r := p.NewReader(context.Background(), Request{Digest: d, Size: int64(len(blob)),
		Endpoints: func() []Endpoint { return []Endpoint{{Name: "origin", Open: flaky}} }})
	got, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("read %d bytes, err %v; want the blob", len(got), err)
	}
	if n := origin.requests.Load(); n != 4 {
		t.Fatalf("the origin was asked %d times, want 4 (two 500s, a cut, a resume)", n)
	}
	var rgs []string
	for range 4 {
		rgs = append(rgs, <-origin.ranges)
	}
	if rgs[3] == "" {
		t.Fatalf("the read after the cut asked for the whole blob again (%q), want a Range from the byte reached", rgs)
	}
	if _, slept := clock.elapsed(); slept == 0 {
		t.Fatal("the origin's 500s were retried without backoff")
	}
}

// A read is bounded by Attempts however the origin fails, and a final error (not found) is not retried.
func TestFinalErrorsAreNotRetried(t *testing.T) {
	_, d := testBlob()
	var n atomic.Int32
	open := func(ctx context.Context, offset int64) (io.ReadCloser, int64, error) {
		n.Add(1)
		return nil, 0, fmt.Errorf("blob: %w", errdef.ErrNotFound)
	}
	_, err := Policy{Clock: newFakeClock()}.Open(context.Background(), Request{Digest: d, Size: 10,
		Endpoints: func() []Endpoint { return []Endpoint{{Name: "origin", Open: open}} }})
	if !errors.Is(err, errdef.ErrNotFound) || n.Load() != 1 {
		t.Fatalf("not found: %v after %d requests, want it after one", err, n.Load())
	}
}
