package cas

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	digest "github.com/opencontainers/go-digest"
)

// source serves blob from any offset (like an HTTP Range request) and counts the bytes it hands out.
type source struct {
	blob     []byte
	seekable bool
	cut      int64 // if > 0, the stream ends early after this many bytes (a dropped connection)
	opens    atomic.Int32
	served   atomic.Int64
}

func (s *source) open(_ context.Context, offset int64) (io.ReadCloser, int64, error) {
	s.opens.Add(1)
	if !s.seekable {
		offset = 0
	}
	b := s.blob[offset:]
	if s.cut > 0 && int64(len(b)) > s.cut {
		b = b[:s.cut]
	}
	s.served.Add(int64(len(b)))
	return io.NopCloser(bytes.NewReader(b)), offset, nil
}

func blob(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

func open(t *testing.T) *Store {
	t.Helper()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Flushed before its directory is removed, not by a timer while it is (or after).
	t.Cleanup(func() { s.Close() })
	return s
}

// gateFlights returns a channel closed once n callers of Ingest have started or joined a shared ingest.
func gateFlights(t *testing.T, n int) <-chan struct{} {
	t.Helper()
	var mu sync.Mutex
	ch := make(chan struct{})
	count := 0
	flightHook = func(string) {
		mu.Lock()
		defer mu.Unlock()
		if count++; count == n {
			close(ch)
		}
	}
	t.Cleanup(func() { flightHook = nil })
	return ch
}

func partials(t *testing.T, s *Store) map[digest.Digest]int64 {
	t.Helper()
	p, err := s.Partials()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestIngestCommitsVerifiedReadOnlyBlob(t *testing.T) {
	s := open(t)
	b := blob(3 << 20)
	d := digest.FromBytes(b)
	src := &source{blob: b, seekable: true}
	if err := s.Ingest(context.Background(), d, int64(len(b)), src.open); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(s.Path(d))
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("committed blob differs: %v", err)
	}
	fi, _ := os.Stat(s.Path(d))
	if fi.Mode().Perm()&0o222 != 0 {
		t.Fatalf("committed blob is writable: %v", fi.Mode())
	}
	if err := s.Verify(d); err != nil {
		t.Fatal(err)
	}
	// Present already: no second transfer.
	if err := s.Ingest(context.Background(), d, int64(len(b)), src.open); err != nil || src.opens.Load() != 1 {
		t.Fatalf("second ingest: %v, opens %d", err, src.opens.Load())
	}
	if len(partials(t, s)) != 0 {
		t.Fatal("partial left after commit")
	}
}

func TestIngestDropsMismatchedBytes(t *testing.T) {
	s := open(t)
	b := blob(1 << 20)
	d := digest.FromBytes(b)
	corrupt := append([]byte(nil), b...)
	corrupt[12345] ^= 0xff
	err := s.Ingest(context.Background(), d, int64(len(b)), (&source{blob: corrupt, seekable: true}).open)
	if !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("got %v, want ErrDigestMismatch", err)
	}
	if ok, _ := s.Exists(d, int64(len(b))); ok {
		t.Fatal("corrupt blob committed")
	}
	if len(partials(t, s)) != 0 {
		t.Fatal("corrupt bytes kept as a partial")
	}
	// Too many bytes: refused, not truncated to fit.
	err = s.Ingest(context.Background(), d, int64(len(b)), (&source{blob: append(b, 'x'), seekable: true}).open)
	if !errors.Is(err, ErrSizeMismatch) {
		t.Fatalf("oversized source: %v", err)
	}
	if ok, _ := s.Exists(d, int64(len(b))); ok || len(partials(t, s)) != 0 {
		t.Fatal("oversized source left content")
	}
}

func TestIngestResumesWhereItStopped(t *testing.T) {
	s := open(t)
	b := blob(5 << 20)
	d := digest.FromBytes(b)
	cut := &source{blob: b, seekable: true, cut: 2 << 20}
	err := s.Ingest(context.Background(), d, int64(len(b)), cut.open)
	if !errors.Is(err, ErrSizeMismatch) {
		t.Fatalf("dropped connection: %v", err)
	}
	if got := partials(t, s)[d]; got != 2<<20 {
		t.Fatalf("partial holds %d bytes, want %d", got, 2<<20)
	}
	// A new store on the same root (a restart) resumes: only the missing bytes are asked for.
	s2, err := Open(s.Root())
	if err != nil {
		t.Fatal(err)
	}
	rest := &source{blob: b, seekable: true}
	if err := s2.Ingest(context.Background(), d, int64(len(b)), rest.open); err != nil {
		t.Fatal(err)
	}
	if got := rest.served.Load(); got != int64(len(b))-2<<20 {
		t.Fatalf("resume transferred %d bytes, want %d", got, int64(len(b))-2<<20)
	}
	if err := s2.Verify(d); err != nil {
		t.Fatal(err)
	}
}

func TestIngestStartsOverWhenTheSourceCannotSeek(t *testing.T) {
	s := open(t)
	b := blob(1 << 20)
	d := digest.FromBytes(b)
	_ = s.Ingest(context.Background(), d, int64(len(b)), (&source{blob: b, seekable: true, cut: 1000}).open)
	if err := s.Ingest(context.Background(), d, int64(len(b)), (&source{blob: b}).open); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(d); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentIngestsOfOneDigestTransferOnce(t *testing.T) {
	s := open(t)
	b := blob(4 << 20)
	d := digest.FromBytes(b)
	src := &source{blob: b, seekable: true}
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.Ingest(context.Background(), d, int64(len(b)), src.open)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := src.served.Load(); got != int64(len(b)) {
		t.Fatalf("served %d bytes for 32 concurrent ingests, want one blob (%d)", got, len(b))
	}
}

func TestWriteHashesInOnePassAndVerifyCatchesCorruption(t *testing.T) {
	s := open(t)
	b := blob(2 << 20)
	d, n, err := s.Write(context.Background(), bytes.NewReader(b))
	if err != nil || d != digest.FromBytes(b) || n != int64(len(b)) {
		t.Fatalf("Write = %s, %d, %v", d, n, err)
	}
	if d2, _, err := s.Write(context.Background(), bytes.NewReader(b)); err != nil || d2 != d {
		t.Fatalf("rewrite: %s %v", d2, err)
	}
	// Damage the committed blob behind the store's back.
	p := s.Path(d)
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, append(b[:100:100], 'x'), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(d); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("Verify of a damaged blob: %v", err)
	}
	var seen int
	if err := s.Walk(func(digest.Digest, int64) error { seen++; return nil }); err != nil || seen != 1 {
		t.Fatalf("Walk saw %d blobs: %v", seen, err)
	}
	if err := s.Delete(d); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(d); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after Delete: %v", err)
	}
}

func TestRecoverDropsInterruptedWritesKeepsPartials(t *testing.T) {
	s := open(t)
	b := blob(1 << 20)
	d := digest.FromBytes(b)
	_ = s.Ingest(context.Background(), d, int64(len(b)), (&source{blob: b, seekable: true, cut: 4096}).open)
	stale := filepath.Join(s.Root(), "ingest", "write-123.partial")
	if err := os.WriteFile(stale, []byte("half a pack"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Recover(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatal("interrupted Write temporary survived Recover")
	}
	if partials(t, s)[d] != 4096 {
		t.Fatal("resumable partial was not kept")
	}
}

func TestIngestRefusesBadArguments(t *testing.T) {
	s := open(t)
	src := &source{blob: []byte("x")}
	if err := s.Ingest(context.Background(), "sha256:nothex", 1, src.open); err == nil {
		t.Fatal("accepted an invalid digest")
	}
	if err := s.Ingest(context.Background(), digest.FromString("x"), -1, src.open); err == nil {
		t.Fatal("accepted a negative size")
	}
	if src.opens.Load() != 0 {
		t.Fatal("opened the source for a refused ingest")
	}
}

// A caller that gives up (its context is cancelled) must not fail the other callers that joined its ingest.
func TestCancelledIngestDoesNotFailJoinedCallers(t *testing.T) {
	s := open(t)
	b := blob(1 << 20)
	d := digest.FromBytes(b)
	opened := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	slow := func(_ context.Context, offset int64) (io.ReadCloser, int64, error) {
		once.Do(func() { close(opened) })
		<-release
		return io.NopCloser(bytes.NewReader(b[offset:])), offset, nil
	}
	joined := gateFlights(t, 2)
	ctxA, cancelA := context.WithCancel(context.Background())
	errA := make(chan error, 1)
	go func() { errA <- s.Ingest(ctxA, d, int64(len(b)), slow) }()
	<-opened
	errB := make(chan error, 1)
	go func() {
		errB <- s.Ingest(context.Background(), d, int64(len(b)), (&source{blob: b, seekable: true}).open)
	}()
	<-joined // B is registered with A's ingest, which cannot finish before release
	cancelA()
	close(release)
	if err := <-errA; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v", err)
	}
	if err := <-errB; err != nil {
		t.Fatalf("a caller that was not cancelled failed: %v", err)
	}
	if err := s.Verify(d); err != nil {
		t.Fatal(err)
	}
}

// Callers that disagree on a blob's size do not share an ingest: each gets the answer for the size it gave.
func TestConcurrentIngestsOfOneDigestWithAnotherSizeAreNotCoalesced(t *testing.T) {
	s := open(t)
	b := blob(1 << 20)
	d := digest.FromBytes(b)
	opened := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	slow := func(_ context.Context, offset int64) (io.ReadCloser, int64, error) {
		once.Do(func() { close(opened) })
		<-release
		return io.NopCloser(bytes.NewReader(b[offset:])), offset, nil
	}
	entered := gateFlights(t, 2)
	errA := make(chan error, 1)
	go func() { errA <- s.Ingest(context.Background(), d, int64(len(b)), slow) }()
	<-opened
	errB := make(chan error, 1)
	go func() {
		errB <- s.Ingest(context.Background(), d, int64(len(b))+1, (&source{blob: b, seekable: true}).open)
	}()
	<-entered // B has started its own ingest (it would have joined A's if the key were the digest alone)
	close(release)
	if err := <-errA; err != nil {
		t.Fatal(err)
	}
	if err := <-errB; !errors.Is(err, ErrSizeMismatch) {
		t.Fatalf("ingest with a wrong size: %v, want a size mismatch", err)
	}
}

// A crash after the last byte was written but before the commit leaves a complete partial: the next ingest
// commits it without asking the source for anything (a range from its end would be refused with 416).
func TestIngestCommitsACompletePartialWithoutTheSource(t *testing.T) {
	s := open(t)
	b := blob(1 << 20)
	d := digest.FromBytes(b)
	p := filepath.Join(s.Root(), "ingest", "sha256-"+d.Encoded()+".partial")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	src := &source{blob: b, seekable: true}
	if err := s.Ingest(context.Background(), d, int64(len(b)), src.open); err != nil {
		t.Fatal(err)
	}
	if src.opens.Load() != 0 {
		t.Fatalf("opened the source %d times for a complete partial", src.opens.Load())
	}
	if err := s.Verify(d); err != nil {
		t.Fatal(err)
	}
	// A complete-length partial with the wrong bytes is dropped and fetched again.
	c := blob(4096)
	dc := digest.FromBytes(c)
	bad := append([]byte(nil), c...)
	bad[0] ^= 1
	if err := os.WriteFile(filepath.Join(s.Root(), "ingest", "sha256-"+dc.Encoded()+".partial"), bad, 0o644); err != nil {
		t.Fatal(err)
	}
	src2 := &source{blob: c, seekable: true}
	if err := s.Ingest(context.Background(), dc, int64(len(c)), src2.open); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(dc); err != nil || src2.served.Load() != int64(len(c)) {
		t.Fatalf("refetch of a bad complete partial: %v, served %d", err, src2.served.Load())
	}
}
