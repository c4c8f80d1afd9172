package prepull

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeBackend pulls by waiting on per-ref gates, so tests control timing exactly.
type fakeBackend struct {
	mu       sync.Mutex
	pins     map[string]digest.Digest
	bad      map[string]error // Resolve fails
	denied   map[string]bool  // Verify fails
	gates    map[string]chan struct{}
	active   int
	maxSeen  int
	pulls    map[string]int
	verified []string
	pinFails int // the next Pins fail, as when GC evicted the model first
}

func newFake() *fakeBackend {
	return &fakeBackend{pins: map[string]digest.Digest{}, bad: map[string]error{}, denied: map[string]bool{},
		gates: map[string]chan struct{}{}, pulls: map[string]int{}}
}

func (f *fakeBackend) gate(ref string) chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	g, ok := f.gates[ref]
	if !ok {
		g = make(chan struct{})
		f.gates[ref] = g
	}
	return g
}

func (f *fakeBackend) Resolve(_ context.Context, ref string) (ocispec.Descriptor, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.bad[ref]; err != nil {
		return ocispec.Descriptor{}, err
	}
	return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString(ref), Size: 100}, nil
}

func (f *fakeBackend) Verify(_ context.Context, ref string, _ ocispec.Descriptor) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.verified = append(f.verified, ref)
	if f.denied[ref] {
		return errors.New("no trusted signature")
	}
	return nil
}

func (f *fakeBackend) Pull(ctx context.Context, ref string, desc ocispec.Descriptor, progress func(done, total int64)) (digest.Digest, error) {
	f.mu.Lock()
	f.active++
	f.maxSeen = max(f.maxSeen, f.active)
	f.pulls[ref]++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.active--
		f.mu.Unlock()
	}()
	progress(50, 100)
	select {
	case <-f.gate(ref):
		progress(100, 100)
		return desc.Digest, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (f *fakeBackend) Pin(_ context.Context, name string, d digest.Digest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pinFails > 0 {
		f.pinFails--
		return errors.New("manifest not found (pull it first)")
	}
	f.pins[name] = d
	return nil
}

func (f *fakeBackend) Unpin(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pins, name)
	return nil
}

func (f *fakeBackend) Pins(context.Context) (map[string]digest.Digest, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]digest.Digest{}
	for k, v := range f.pins {
		out[k] = v
	}
	return out, nil
}

func (f *fakeBackend) Cache(context.Context) ([]CacheEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []CacheEntry
	for name, d := range f.pins {
		out = append(out, CacheEntry{Digest: d, Complete: true, Owners: []string{"pin:" + name}})
	}
	return out, nil
}

func (f *fakeBackend) pinned(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.pins[name]
	return ok
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// serve starts the API on a socket in a temp dir and returns a client; it stops with the test.
func serve(t *testing.T, be Backend, opts Options) *Client {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLog()
	}
	// Unix socket paths are limited to ~108 bytes; t.TempDir() can be longer.
	dir, err := os.MkdirTemp("", "pp")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "prepull.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, sock, be, opts) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		os.RemoveAll(dir)
	})
	c := NewClient(sock)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := c.Entries(context.Background(), "", 0); err == nil {
			return c
		} else if time.Now().After(deadline) {
			t.Fatalf("server did not start: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFor follows the server until cond holds for the list's entries.
func waitFor(t *testing.T, c *Client, list string, cond func(map[string]Entry) bool) map[string]Entry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var since uint64
	for {
		s, err := c.Entries(ctx, list, since)
		if err != nil {
			t.Fatalf("waiting: %v", err)
		}
		m := map[string]Entry{}
		for _, e := range s.Entries {
			m[e.Ref] = e
		}
		if cond(m) {
			return m
		}
		since = s.Version
	}
}

func TestPrepullPinsWhileListedAndUnpinsWhenRemoved(t *testing.T) {
	be := newFake()
	c := serve(t, be, Options{Concurrency: 2})
	ctx := context.Background()
	if _, err := c.SetList(ctx, "nodes", []string{"r/a:1", "r/b:1"}); err != nil {
		t.Fatal(err)
	}
	m := waitFor(t, c, "nodes", func(m map[string]Entry) bool {
		return m["r/a:1"].State == StatePulling && m["r/b:1"].State == StatePulling && m["r/a:1"].Done > 0
	})
	if p := m["r/a:1"].Percent(); p != 50 {
		t.Errorf("progress = %d%%, want 50%%", p)
	}
	if m["r/a:1"].Status() != "pulling 50%" {
		t.Errorf("status = %q", m["r/a:1"].Status())
	}
	close(be.gate("r/a:1"))
	close(be.gate("r/b:1"))
	m = waitFor(t, c, "nodes", func(m map[string]Entry) bool {
		return m["r/a:1"].State == StateReady && m["r/b:1"].State == StateReady
	})
	if m["r/a:1"].Digest != digest.FromString("r/a:1") {
		t.Errorf("digest = %s", m["r/a:1"].Digest)
	}
	for _, r := range []string{"r/a:1", "r/b:1"} {
		if !be.pinned(PinName("nodes", r)) {
			t.Errorf("%s not pinned", r)
		}
	}
	// Removing b from the list unpins it before the call returns; a stays.
	s, err := c.SetList(ctx, "nodes", []string{"r/a:1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Entries) != 1 || s.Entries[0].Ref != "r/a:1" {
		t.Errorf("entries after removal = %+v", s.Entries)
	}
	if be.pinned(PinName("nodes", "r/b:1")) {
		t.Error("removed entry still pinned")
	}
	if !be.pinned(PinName("nodes", "r/a:1")) {
		t.Error("kept entry unpinned")
	}
	// The cache view reports the pins with their owners.
	ce, err := c.Cache(ctx)
	if err != nil || len(ce) != 1 || ce[0].Owners[0] != "pin:"+PinName("nodes", "r/a:1") {
		t.Errorf("cache = %+v, %v", ce, err)
	}
}

func TestPrepullConcurrencyLimit(t *testing.T) {
	be := newFake()
	c := serve(t, be, Options{Concurrency: 2})
	refs := []string{"r/a:1", "r/b:1", "r/c:1", "r/d:1"}
	if _, err := c.Add(context.Background(), "", refs); err != nil {
		t.Fatal(err)
	}
	m := waitFor(t, c, DefaultList, func(m map[string]Entry) bool {
		n := 0
		for _, e := range m {
			if e.State == StatePulling {
				n++
			}
		}
		return n == 2
	})
	pending := 0
	for _, e := range m {
		if e.State == StatePending {
			pending++
		}
	}
	if pending != 2 {
		t.Errorf("pending = %d, want 2: %+v", pending, m)
	}
	for _, r := range refs {
		close(be.gate(r))
	}
	waitFor(t, c, DefaultList, func(m map[string]Entry) bool {
		for _, e := range m {
			if e.State != StateReady {
				return false
			}
		}
		return len(m) == 4
	})
	if be.maxSeen != 2 {
		t.Errorf("at most %d pulls ran at once, want 2", be.maxSeen)
	}
}

func TestPrepullFailureDoesNotBlockOthersAndRetries(t *testing.T) {
	be := newFake()
	be.bad["bad/ref:1"] = errors.New("manifest unknown")
	be.denied["r/unsigned:1"] = true
	close(be.gate("r/good:1"))
	c := serve(t, be, Options{Concurrency: 1, RetryDelay: time.Hour})
	if _, err := c.SetList(context.Background(), "l", []string{"bad/ref:1", "r/unsigned:1", "r/good:1"}); err != nil {
		t.Fatal(err)
	}
	m := waitFor(t, c, "l", func(m map[string]Entry) bool {
		return m["bad/ref:1"].State == StateFailed && m["r/unsigned:1"].State == StateFailed && m["r/good:1"].State == StateReady
	})
	if got := m["bad/ref:1"].Status(); got != "failed: resolve: manifest unknown" {
		t.Errorf("bad ref status = %q", got)
	}
	if got := m["r/unsigned:1"].Error; !strings.HasPrefix(got, "trust policy: ") {
		t.Errorf("unsigned error = %q", got)
	}
	if be.pulls["r/unsigned:1"] != 0 {
		t.Error("a reference the policy refused was pulled")
	}
	if be.pinned(PinName("l", "bad/ref:1")) || be.pinned(PinName("l", "r/unsigned:1")) {
		t.Error("failed entries are pinned")
	}
	// Adding a failed entry again retries it at once instead of waiting out the backoff.
	be.mu.Lock()
	delete(be.bad, "bad/ref:1")
	be.mu.Unlock()
	close(be.gate("bad/ref:1"))
	if _, err := c.Add(context.Background(), "l", []string{"bad/ref:1"}); err != nil {
		t.Fatal(err)
	}
	m = waitFor(t, c, "l", func(m map[string]Entry) bool { return m["bad/ref:1"].State == StateReady })
	if m["bad/ref:1"].Attempts != 2 {
		t.Errorf("attempts = %d, want 2", m["bad/ref:1"].Attempts)
	}
}

func TestPrepullCancelStopsPullAndUnpins(t *testing.T) {
	be := newFake()
	c := serve(t, be, Options{})
	ctx := context.Background()
	if _, err := c.Add(ctx, "", []string{"r/big:1"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, c, DefaultList, func(m map[string]Entry) bool { return m["r/big:1"].State == StatePulling })
	if err := c.Remove(ctx, DefaultList, "r/big:1"); err != nil {
		t.Fatal(err)
	}
	be.mu.Lock()
	active := be.active
	be.mu.Unlock()
	if active != 0 {
		t.Error("pull still running after cancel returned")
	}
	if be.pinned(PinName(DefaultList, "r/big:1")) {
		t.Error("cancelled entry pinned")
	}
	if err := c.Remove(ctx, DefaultList, "r/big:1"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("second cancel = %v, want 404", err)
	}
	// Re-adding starts afresh.
	close(be.gate("r/big:1"))
	if _, err := c.Add(ctx, "", []string{"r/big:1"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, c, DefaultList, func(m map[string]Entry) bool { return m["r/big:1"].State == StateReady })
	if !be.pinned(PinName(DefaultList, "r/big:1")) {
		t.Error("re-added entry not pinned")
	}
}

func TestPrepullRestoresPinsAfterRestart(t *testing.T) {
	be := newFake()
	d := digest.FromString("old")
	be.pins[PinName("nodes", "r/a:1")] = d
	be.pins["someone-else"] = d
	c := serve(t, be, Options{})
	s, err := c.Entries(context.Background(), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Entries) != 1 || s.Entries[0].Ref != "r/a:1" || s.Entries[0].State != StateReady || s.Entries[0].Digest != d {
		t.Fatalf("restored = %+v", s.Entries)
	}
	// The list no longer names it: the pin left by the earlier run goes.
	if _, err := c.SetList(context.Background(), "nodes", nil); err != nil {
		t.Fatal(err)
	}
	if be.pinned(PinName("nodes", "r/a:1")) {
		t.Error("stale pin kept")
	}
	if !be.pinned("someone-else") {
		t.Error("a pin prepull does not own was removed")
	}
}

func TestPrepullRejectsBadRequests(t *testing.T) {
	c := serve(t, newFake(), Options{})
	ctx := context.Background()
	if _, err := c.Add(ctx, "Bad/List", []string{"r/a:1"}); err == nil {
		t.Error("bad list name accepted")
	}
	if _, err := c.Add(ctx, "", []string{"has space"}); err == nil {
		t.Error("bad reference accepted")
	}
	if _, err := c.SetList(ctx, "x", []string{""}); err == nil {
		t.Error("empty reference accepted")
	}
}

func TestParseList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  string
	}{
		{in: "", want: []string{}},
		{in: "- r/a:1\n- r/b@sha256:abc\n- r/a:1\n", want: []string{"r/a:1", "r/b@sha256:abc"}},
		{in: "models:\n  - r/a:1\n  - ref: r/b:2\n", want: []string{"r/a:1", "r/b:2"}},
		{in: "models: []\n", want: []string{}},
		{in: "model:\n  - r/a:1\n", err: "unknown field"},
		{in: "models:\n  - ref: r/a:1\n    tag: x\n", err: "unknown field"},
		{in: "models:\n  - ''\n", err: "entry 1"},
		{in: "models: [1]\n", err: "unexpected number"},
		{in: "models: [\n", err: "yaml"},
	} {
		got, err := ParseList([]byte(tc.in))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseList(%q) err = %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("ParseList(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// writeConfigMap lays out a file the way the kubelet does for a ConfigMap volume: the data lives in a timestamped
// directory, ..data points at it, and the file is a symlink through ..data; an update swaps ..data atomically.
func writeConfigMap(t *testing.T, dir, name, content string) {
	t.Helper()
	ts := filepath.Join(dir, fmt.Sprintf("..%d", time.Now().UnixNano()))
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ts, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, name)
	if _, err := os.Lstat(link); err != nil {
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWatcherFollowsConfigMapUpdates(t *testing.T) {
	be := newFake()
	close(be.gate("r/a:1"))
	close(be.gate("r/b:1"))
	c := serve(t, be, Options{RetryDelay: time.Hour})
	dir := t.TempDir()
	writeConfigMap(t, dir, "models.yaml", "models:\n  - r/a:1\n  - bad/x:1\n")
	be.bad["bad/x:1"] = errors.New("name unknown")

	reg := prometheus.NewRegistry()
	w := &Watcher{Client: c, File: filepath.Join(dir, "models.yaml"), List: "configmap", Poll: 20 * time.Millisecond,
		Log: quietLog(), Metrics: NewWatchMetrics(reg, "node-1")}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	waitFor(t, c, "configmap", func(m map[string]Entry) bool {
		return m["r/a:1"].State == StateReady && m["bad/x:1"].State == StateFailed
	})
	eventually(t, func() bool {
		return testutil.ToFloat64(w.Metrics.state.WithLabelValues("r/a:1", "ready")) == 1 &&
			testutil.ToFloat64(w.Metrics.failure.WithLabelValues("bad/x:1", "resolve: name unknown")) == 1
	})
	if !be.pinned(PinName("configmap", "r/a:1")) {
		t.Fatal("listed model not pinned")
	}

	// An invalid edit keeps the last good list.
	writeConfigMap(t, dir, "models.yaml", "models: [\n")
	eventually(t, func() bool { return testutil.ToFloat64(w.Metrics.listValid) == 0 })
	if !be.pinned(PinName("configmap", "r/a:1")) {
		t.Fatal("an invalid list unpinned a model")
	}

	// The next update swaps ..data: a is dropped and unpinned, b is pulled.
	writeConfigMap(t, dir, "models.yaml", "models:\n  - r/b:1\n")
	waitFor(t, c, "configmap", func(m map[string]Entry) bool {
		_, hasA := m["r/a:1"]
		return !hasA && m["r/b:1"].State == StateReady
	})
	eventually(t, func() bool { return !be.pinned(PinName("configmap", "r/a:1")) })
	eventually(t, func() bool {
		return testutil.ToFloat64(w.Metrics.listEntries) == 1 && testutil.CollectAndCount(w.Metrics.state) == 4 &&
			testutil.CollectAndCount(w.Metrics.failure) == 0 &&
			testutil.ToFloat64(w.Metrics.state.WithLabelValues("r/b:1", "ready")) == 1 &&
			testutil.ToFloat64(w.Metrics.progress.WithLabelValues("r/b:1")) == 1
	})
}

func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPrepullPullsAgainWhenEvictedBeforePin(t *testing.T) {
	be := newFake()
	be.pinFails = 1
	close(be.gate("r/a:1"))
	c := serve(t, be, Options{RetryDelay: time.Hour})
	if _, err := c.Add(context.Background(), "", []string{"r/a:1"}); err != nil {
		t.Fatal(err)
	}
	m := waitFor(t, c, DefaultList, func(m map[string]Entry) bool { return m["r/a:1"].State == StateReady })
	if be.pulls["r/a:1"] != 2 || m["r/a:1"].Attempts != 1 {
		t.Errorf("pulls = %d, attempts = %d; want the pull repeated within one attempt", be.pulls["r/a:1"], m["r/a:1"].Attempts)
	}
	be.pinFails = 2
	close(be.gate("r/b:1"))
	if _, err := c.Add(context.Background(), "", []string{"r/b:1"}); err != nil {
		t.Fatal(err)
	}
	m = waitFor(t, c, DefaultList, func(m map[string]Entry) bool { return m["r/b:1"].State == StateFailed })
	if !strings.HasPrefix(m["r/b:1"].Error, "pin: ") {
		t.Errorf("error = %q", m["r/b:1"].Error)
	}
}

// A list that never parsed is reported once, not on every poll, and nothing is sent until it parses.
func TestWatcherWaitsForAValidList(t *testing.T) {
	be := newFake()
	close(be.gate("r/a:1"))
	c := serve(t, be, Options{})
	dir := t.TempDir()
	writeConfigMap(t, dir, "models.yaml", "models: [\n")
	var logs bytes.Buffer
	var mu sync.Mutex
	w := &Watcher{Client: c, File: filepath.Join(dir, "models.yaml"), List: "configmap", Poll: 10 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil)), Metrics: NewWatchMetrics(nil, "")}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	n := strings.Count(logs.String(), "prepull list invalid")
	mu.Unlock()
	if n != 1 {
		t.Errorf("invalid list logged %d times, want once", n)
	}
	if s, _ := c.Entries(context.Background(), "configmap", 0); len(s.Entries) != 0 {
		t.Errorf("entries from an invalid list: %+v", s.Entries)
	}
	writeConfigMap(t, dir, "models.yaml", "- r/a:1\n")
	waitFor(t, c, "configmap", func(m map[string]Entry) bool { return m["r/a:1"].State == StateReady })
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestPrepullNeverRepeatsAPassword: a reference with a password, in the watched ConfigMap or sent to the API, is
// refused without being stored, so the password is in no log line (watcher's or driver's), no API answer and no
// error the CLI prints.
func TestPrepullNeverRepeatsAPassword(t *testing.T) {
	const secret = "hunter2-s3cret"
	ref := "bob:" + secret + "@registry.example.com/org/m:1"
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	be := newFake()
	close(be.gate("r/a:1"))
	c := serve(t, be, Options{Logger: log})
	ctx := context.Background()
	for _, call := range []func() error{
		func() error { _, err := c.Add(ctx, "", []string{ref}); return err },
		func() error { _, err := c.SetList(ctx, "x", []string{"r/a:1", ref}); return err },
	} {
		err := call()
		if err == nil || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "credentials") {
			t.Errorf("API answer %v: want a refusal that names credentials and not the password", err)
		}
	}
	dir := t.TempDir()
	writeConfigMap(t, dir, "models.yaml", "models:\n  - r/a:1\n  - ref: "+ref+"\n")
	if _, err := ReadList(filepath.Join(dir, "models.yaml")); err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("ReadList (the CLI's --file): %v", err)
	}
	w := &Watcher{Client: c, File: filepath.Join(dir, "models.yaml"), List: "configmap", Poll: 10 * time.Millisecond,
		Log: log, Metrics: NewWatchMetrics(nil, "")}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { cancel(); <-done }()
	eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(logs.String(), "prepull list invalid")
	})
	s, err := c.Entries(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(s); strings.Contains(string(b), secret) {
		t.Errorf("API status holds the password: %s", b)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(logs.String(), secret) {
		t.Errorf("the password is logged:\n%s", logs.String())
	}
}

// TestWatcherReadyOnlyWhenEveryModelIsHeld: the readiness the DaemonSet's probe reads is false, with every
// lagging model and its reason, until the driver holds each entry of the list in force; a failing entry keeps it
// false with the failure named, and dropping that entry from the list makes the node ready.
func TestWatcherReadyOnlyWhenEveryModelIsHeld(t *testing.T) {
	be := newFake()
	gateA := be.gate("r/a:1")
	be.bad["bad/x:1"] = errors.New("name unknown")
	c := serve(t, be, Options{RetryDelay: time.Hour})
	dir := t.TempDir()
	w := &Watcher{Client: c, File: filepath.Join(dir, "models.yaml"), List: "configmap", Poll: 10 * time.Millisecond,
		Log: quietLog(), Metrics: NewWatchMetrics(nil, "")}
	if ok, why := w.Ready(); ok || why != "prepull list not loaded yet" {
		t.Fatalf("before any list: Ready = %v, %q", ok, why)
	}
	writeConfigMap(t, dir, "models.yaml", "models:\n  - r/a:1\n  - bad/x:1\n")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	// a is held in its pull by the gate, bad fails: both are named, with the state and the failure's reason.
	waitFor(t, c, "configmap", func(m map[string]Entry) bool { return m["bad/x:1"].State == StateFailed })
	eventually(t, func() bool {
		ok, why := w.Ready()
		return !ok && strings.Contains(why, "2 of 2 models not ready") &&
			strings.Contains(why, "bad/x:1: failed: resolve: name unknown") && strings.Contains(why, "r/a:1: pulling")
	})

	// a arrives: the failing entry alone keeps the node unready.
	close(gateA)
	waitFor(t, c, "configmap", func(m map[string]Entry) bool { return m["r/a:1"].State == StateReady })
	eventually(t, func() bool {
		ok, why := w.Ready()
		return !ok && why == "1 of 2 models not ready: bad/x:1: failed: resolve: name unknown"
	})

	// The failing entry is dropped from the list: every listed model is held.
	writeConfigMap(t, dir, "models.yaml", "models:\n  - r/a:1\n")
	eventually(t, func() bool {
		ok, why := w.Ready()
		return ok && why == "all 1 models ready"
	})

	// An invalid edit keeps the last good list in force, and so the readiness.
	writeConfigMap(t, dir, "models.yaml", "models: [\n")
	eventually(t, func() bool { return testutil.ToFloat64(w.Metrics.listValid) == 0 })
	if ok, why := w.Ready(); !ok {
		t.Fatalf("an invalid edit made the node unready: %q", why)
	}
}
