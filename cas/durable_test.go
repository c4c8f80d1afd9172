package cas

import (
	"bytes"
	"context"
	_ "crypto/sha512"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofrs/flock"
	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/internal/diskio"
	"github.com/modelpack/modelpack/internal/testenv"
)

const crashEnv = "MODELPACK_CAS_CRASH_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(crashEnv) != "" {
		os.Exit(crashHelper())
	}
	os.Exit(m.Run())
}

// fakeBoot points the boot id at a file the test controls and returns a function that "reboots" the machine.
func fakeBoot(t *testing.T) (reboot func()) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "boot_id")
	n := 0
	reboot = func() {
		n++
		if err := os.WriteFile(p, []byte(fmt.Sprintf("boot-%d\n", n)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reboot()
	t.Cleanup(FakeBootIDForTesting(p))
	return reboot
}

// holdFlushes keeps the background flush of the given digests waiting until the returned release is called.
func holdFlushes(t *testing.T, held ...digest.Digest) (release func()) {
	t.Helper()
	gate := make(chan struct{})
	hook := func(d digest.Digest) {
		if slices.Contains(held, d) {
			<-gate
		}
	}
	flushHook.Store(&hook)
	released := false
	release = func() {
		if !released {
			released = true
			close(gate)
		}
	}
	t.Cleanup(func() { release(); flushHook.Store(nil) })
	return release
}

func ingest(t *testing.T, s *Store, b []byte) digest.Digest {
	t.Helper()
	d := digest.FromBytes(b)
	if err := s.Ingest(context.Background(), d, int64(len(b)), (&source{blob: b, seekable: true}).open); err != nil {
		t.Fatal(err)
	}
	return d
}

// A commit does not wait for the disk: the blob is readable at once, and its durable mark appears only once the
// background flush has completed.
func TestCommitDoesNotWaitForTheFlush(t *testing.T) {
	fakeBoot(t)
	s := open(t)
	b := blob(1 << 20)
	release := holdFlushes(t, digest.FromBytes(b))
	d := ingest(t, s, b)
	if got, err := os.ReadFile(s.Path(d)); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("committed blob not readable before its flush: %v", err)
	}
	if s.Durable(d) {
		t.Fatal("marked durable before the flush ran")
	}
	release()
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if !s.Durable(d) {
		t.Fatal("not marked durable after the flush")
	}
	// A deleted blob loses its mark: it must not vouch for the next blob of that digest.
	if err := s.Delete(d); err != nil {
		t.Fatal(err)
	}
	if s.Durable(d) {
		t.Fatal("mark outlived its blob")
	}
}

// After a restart of the machine, blobs committed but not marked durable may hold anything (zeros, stale blocks):
// Open re-hashes exactly those, quarantines the bad ones, and marks the good ones. Marked blobs are not re-read.
func TestOpenAfterRebootRehashesUnmarkedBlobs(t *testing.T) {
	reboot := fakeBoot(t)
	root := t.TempDir()
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // after the held flushes are released
	durable := ingest(t, s, blob(1<<20))
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	lost, kept := blob(2<<20), blob(3<<20)
	release := holdFlushes(t, digest.FromBytes(lost), digest.FromBytes(kept))
	dLost, dKept := ingest(t, s, lost), ingest(t, s, kept)
	// The power went out: the page cache of "lost" never reached the disk, the size did.
	if err := os.Chmod(s.Path(dLost), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.Path(dLost), make([]byte, len(lost)), 0o444); err != nil {
		t.Fatal(err)
	}
	reboot()
	s2, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	rec := s2.Recovered()
	if !rec.BootChanged || rec.Rehashed != 2 || !slices.Equal(rec.Quarantined, []digest.Digest{dLost}) {
		t.Fatalf("recovery %+v, want 2 re-hashed (not the durable one) and %s quarantined", rec, dLost)
	}
	if ok, _ := s2.Exists(dLost, int64(len(lost))); ok {
		t.Fatal("the corrupt blob is still served")
	}
	if _, err := os.Stat(filepath.Join(root, "quarantine", "sha256-"+dLost.Encoded())); err != nil {
		t.Fatalf("corrupt blob not kept in quarantine: %v", err)
	}
	if !s2.Durable(dKept) || !s2.Durable(durable) {
		t.Fatal("verified blobs not marked durable")
	}
	// The next ingest fetches the quarantined blob again.
	release()
	ingest(t, s2, lost)
	if err := s2.Verify(dLost); err != nil {
		t.Fatal(err)
	}
	if n, err := s2.PurgeQuarantine(); err != nil || n != int64(len(lost)) {
		t.Fatalf("purge: %d %v", n, err)
	}
	// Opening again in the same boot re-hashes nothing.
	if err := s2.Sync(); err != nil {
		t.Fatal(err)
	}
	s3, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if rec := s3.Recovered(); rec.BootChanged || rec.Rehashed != 0 || rec.Flushed != 0 {
		t.Fatalf("second open in one boot: %+v", rec)
	}
}

// A store written before durable marks existed fsynced every blob before naming it: its blobs are trusted as they
// are, not re-hashed.
func TestOpenMarksBlobsOfAStoreWithoutBootID(t *testing.T) {
	fakeBoot(t)
	root := t.TempDir()
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	d := ingest(t, s, blob(4096))
	s.Sync()
	for _, p := range []string{filepath.Join(root, "ingest", "boot-id"), s.markPath(d)} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	s2, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if rec := s2.Recovered(); rec.Rehashed != 0 || !s2.Durable(d) {
		t.Fatalf("legacy store: %+v durable=%v", rec, s2.Durable(d))
	}
}

// Lock files go with the ingest that committed; a waiter that locked a lock file meanwhile unlinked takes a fresh
// one instead of guarding nothing.
func TestIngestRemovesItsLockAndLockersNoticeIt(t *testing.T) {
	fakeBoot(t)
	s := open(t)
	d := ingest(t, s, blob(4096))
	if entries, _ := filepath.Glob(filepath.Join(s.Root(), "ingest", "*.lock")); len(entries) != 0 {
		t.Fatalf("lock files left after commit: %v", entries)
	}
	_ = d
	path := filepath.Join(s.Root(), "ingest", "x.lock")
	holder := flock.New(path)
	if ok, err := holder.TryLock(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	got := make(chan *flock.Flock, 1)
	waiting := make(chan struct{})
	go func() {
		close(waiting)
		l, err := lockIngest(context.Background(), path)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	<-waiting
	// Whether the waiter has opened the old file or not, it must end up holding the file now at path.
	os.Remove(path)
	holder.Unlock()
	l := <-got
	defer l.Unlock()
	held, _ := l.Stat()
	named, err := os.Stat(path)
	if err != nil || !os.SameFile(held, named) {
		t.Fatalf("lock held on a file no longer at its path (%v)", err)
	}
}

// crashHelper (a re-executed test binary) ingests one blob and stops at a hook point, waiting to be killed:
// "committed" (named, flush not done), "flushed" (its bytes flushed, its directory not) or "writing" (half the
// bytes in the partial).
func crashHelper() int {
	bootIDFile = os.Getenv("CRASH_BOOT")
	s, err := Open(os.Getenv("CRASH_ROOT"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	b := blob(4 << 20)
	d := digest.FromBytes(b)
	block := make(chan struct{})
	switch os.Getenv("CRASH_AT") {
	case "committed":
		hook := func(digest.Digest) { fmt.Println("committed"); <-block }
		flushHook.Store(&hook)
		err = s.Ingest(context.Background(), d, int64(len(b)), (&source{blob: b}).open)
		if err == nil {
			err = s.Sync() // the flush, at once, held by the hook
		}
	case "flushed":
		hook := func(kind, _ string) {
			if kind == "data" {
				fmt.Println("flushed")
				<-block
			}
		}
		syncHook.Store(&hook)
		err = s.Ingest(context.Background(), d, int64(len(b)), (&source{blob: b}).open)
		if err == nil {
			err = s.Sync() // the blob's bytes flushed, its directory not yet: held by the hook
		}
	case "writing":
		err = s.Ingest(context.Background(), d, int64(len(b)), func(context.Context, int64) (io.ReadCloser, int64, error) {
			return io.NopCloser(io.MultiReader(bytes.NewReader(b[:len(b)/2]), hookReader{func() { fmt.Println("writing"); <-block }})), 0, nil
		})
	}
	fmt.Fprintln(os.Stderr, "reached the end:", err)
	time.Sleep(time.Minute) // the flush is held: wait for the kill
	return 1
}

type hookReader struct{ at func() }

func (h hookReader) Read([]byte) (int, error) { h.at(); return 0, io.EOF }

// TestKilledIngest kills a real process at each hook point, then opens its store as after a process crash (same
// boot: nothing lost) and as after a power loss (new boot: the unflushed bytes are gone).
func TestKilledIngest(t *testing.T) {
	b := blob(4 << 20)
	d := digest.FromBytes(b)
	for _, at := range []string{"committed", "flushed", "writing"} {
		for _, powerLoss := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/powerloss=%v", at, powerLoss), func(t *testing.T) {
				reboot := fakeBoot(t)
				root := t.TempDir()
				line, stderr := testenv.KillAfterFirstLine(t, crashEnv+"=1", "CRASH_ROOT="+root, "CRASH_AT="+at, "CRASH_BOOT="+bootIDFile)
				if line != at {
					t.Fatalf("helper said %q: %s", line, stderr)
				}
				if _, err := os.Lstat(filepath.Join(root, "ingest", "durable", "sha256-"+d.Encoded())); !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("durable mark present before the blob's directory was flushed (%v)", err)
				}
				if at == "flushed" && powerLoss {
					// The bytes reached the disk, the name did not.
					if err := os.Remove(filepath.Join(root, "blobs", "sha256", d.Encoded())); err != nil {
						t.Fatal(err)
					}
				}
				if powerLoss {
					// What a power loss may leave of bytes that were never flushed: the right size, zeros.
					for _, p := range []string{filepath.Join(root, "blobs", "sha256", d.Encoded()), filepath.Join(root, "ingest", "sha256-"+d.Encoded()+".partial")} {
						if fi, err := os.Stat(p); err == nil {
							os.Chmod(p, 0o644)
							if err := os.WriteFile(p, make([]byte, fi.Size()), 0o644); err != nil {
								t.Fatal(err)
							}
						}
					}
					reboot()
				}
				s, err := Open(root)
				if err != nil {
					t.Fatal(err)
				}
				rec := s.Recovered()
				t.Logf("recovery: %+v", rec)
				if err := s.Sync(); err != nil {
					t.Fatal(err)
				}
				if ok, _ := s.Exists(d, int64(len(b))); ok {
					// Whatever is served must be the right bytes.
					if err := s.Verify(d); err != nil {
						t.Fatalf("serving unverified bytes after the kill: %v", err)
					}
				}
				if at != "writing" && !powerLoss && (rec.Flushed != 1 || !s.Durable(d)) {
					t.Fatalf("a process crash lost a committed blob or left it unmarked: %+v", rec)
				}
				if at == "committed" && powerLoss && len(rec.Quarantined) != 1 {
					t.Fatalf("unflushed blob not quarantined after a power loss: %+v", rec)
				}
				// The next ingest completes with the right bytes (resuming or refetching).
				if err := s.Ingest(context.Background(), d, int64(len(b)), (&source{blob: b, seekable: true}).open); err != nil {
					t.Fatal(err)
				}
				if err := s.Verify(d); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// recordSyncs records the flushes the durability protocol completes under root (not those of other tests' stores
// flushing late), as "data <path>" and "dir <path>", calling at for each first.
func recordSyncs(t *testing.T, root string, at func(kind, path string)) func() []string {
	t.Helper()
	var mu sync.Mutex
	var got []string
	hook := func(kind, path string) {
		if !strings.HasPrefix(path, root+string(filepath.Separator)) {
			return
		}
		at(kind, path)
		mu.Lock()
		got = append(got, kind+" "+path)
		mu.Unlock()
	}
	syncHook.Store(&hook)
	t.Cleanup(func() { syncHook.Store(nil) })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// Blobs committed close together are flushed as one batch: the bytes of each, then one fsync per directory (not one
// per blob), and only then their marks.
func TestFlushBatchSyncsEachDirectoryOnce(t *testing.T) {
	fakeBoot(t)
	s := open(t)
	var batch []digest.Digest
	for i := range 5 {
		batch = append(batch, digest.FromBytes(blob(4096+i)))
	}
	for i := range 2 {
		batch = append(batch, digest.SHA512.FromBytes(blob(8192+i)))
	}
	marked := func(dir string) []digest.Digest {
		var m []digest.Digest
		for _, d := range batch {
			if (dir == "" || filepath.Dir(s.Path(d)) == dir) && s.Durable(d) {
				m = append(m, d)
			}
		}
		return m
	}
	syncs := recordSyncs(t, s.Root(), func(kind, path string) {
		switch kind {
		case "data":
			if m := marked(""); len(m) > 0 {
				t.Errorf("marks %v written before every blob of the batch was flushed", m)
			}
		case "dir":
			if m := marked(path); len(m) > 0 {
				t.Errorf("marks %v written before their directory %s was flushed", m, path)
			}
		}
	})
	// An ingest under way holds the flusher back, so that every commit joins one batch whatever the clock says.
	s.ingesting.Add(1)
	for i, d := range batch {
		b := blob(4096 + i)
		if i >= 5 {
			b = blob(8192 + i - 5)
		}
		if err := s.Ingest(context.Background(), d, int64(len(b)), (&source{blob: b}).open); err != nil {
			t.Fatal(err)
		}
	}
	if m := marked(""); len(m) > 0 || len(syncs()) > 0 {
		t.Fatalf("flushed while an ingest ran: %v, marks %v", syncs(), m)
	}
	s.ingesting.Add(-1)
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	var data, dirs []string
	for _, e := range syncs() {
		kind, path, _ := strings.Cut(e, " ")
		switch kind {
		case "data":
			data = append(data, path)
		case "dir":
			dirs = append(dirs, path)
		}
	}
	wantDirs := []string{filepath.Join(s.Root(), "blobs", "sha256"), filepath.Join(s.Root(), "blobs", "sha512")}
	if len(data) != len(batch) || !slices.Equal(dirs, wantDirs) {
		t.Fatalf("a batch of %d blobs in 2 directories made %d data flushes and directory flushes %v, want %d and %v",
			len(batch), len(data), dirs, len(batch), wantDirs)
	}
	if m := marked(""); len(m) != len(batch) {
		t.Fatalf("%d of %d blobs marked durable after Sync", len(m), len(batch))
	}
}

// After a restart of the machine, the unmarked blobs that re-hash correctly are flushed together too: one fsync of
// their directory, not one per blob.
func TestRecoveryFlushesRehashedBlobsAsOneBatch(t *testing.T) {
	reboot := fakeBoot(t)
	root := t.TempDir()
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	var ds []digest.Digest
	s.ingesting.Add(1) // holds the first store's flusher back: the blobs stay unmarked
	for i := range 4 {
		ds = append(ds, ingest(t, s, blob(4096+i)))
	}
	reboot()
	syncs := recordSyncs(t, root, func(kind, path string) {})
	s2, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if rec := s2.Recovered(); rec.Rehashed != len(ds) {
		t.Fatalf("recovery %+v, want %d re-hashed", rec, len(ds))
	}
	var dirs int
	for _, e := range syncs() {
		if strings.HasPrefix(e, "dir "+filepath.Join(root, "blobs")) {
			dirs++
		}
	}
	if dirs != 1 {
		t.Fatalf("recovery flushed the blob directory %d times for %d blobs, want once: %v", dirs, len(ds), syncs())
	}
	for _, d := range ds {
		if !s2.Durable(d) {
			t.Fatalf("%s not marked durable after recovery", d)
		}
	}
	s.ingesting.Add(-1)
	s.Sync()
}

// A blob deleted and committed again while the flush of its first commit runs is not marked by that flush (its
// new bytes were written after the flush began), but by its own.
func TestBlobCommittedAgainIsNotVouchedForByTheEarlierFlush(t *testing.T) {
	fakeBoot(t)
	s := open(t)
	s.ingesting.Add(1) // only the Syncs below flush
	defer s.ingesting.Add(-1)
	b := blob(1 << 20)
	d := ingest(t, s, b)
	held, gate := make(chan struct{}), make(chan struct{})
	var dirs atomic.Int32
	recordSyncs(t, s.Root(), func(kind, _ string) {
		if kind == "dir" && dirs.Add(1) == 1 {
			close(held)
			<-gate // the first commit's bytes and name are flushed, its mark not yet written
		}
	})
	first := make(chan error, 1)
	go func() { first <- s.Sync() }()
	<-held
	if err := s.Delete(d); err != nil {
		t.Fatal(err)
	}
	ingest(t, s, b)
	close(gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if s.Durable(d) {
		t.Fatal("the flush of the first commit marked the second, whose bytes it never flushed")
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if !s.Durable(d) || dirs.Load() != 2 {
		t.Fatalf("second commit: durable=%v after %d directory flushes, want marked after 2", s.Durable(d), dirs.Load())
	}
}

// Short-lived processes (CLI commands) exit before their background flush runs. The next Open in the same boot
// marks the blobs the kernel has long written back, so a restart does not re-hash every model the CLI ever pulled,
// and leaves recent ones to its own background flush, so it does not wait for a pull that just ended.
func TestOpenMarksSettledBlobsAndLeavesRecentOnesToTheFlusher(t *testing.T) {
	reboot := fakeBoot(t)
	root := t.TempDir()
	first, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	old, recent := blob(1<<20), blob(1<<20+1)
	release := holdFlushes(t, digest.FromBytes(old), digest.FromBytes(recent))
	dOld, dRecent := ingest(t, first, old), ingest(t, first, recent)
	// The first process "exits" here with both flushes still held: neither blob is marked.
	past := time.Now().Add(-2 * SettleTime)
	if err := os.Chtimes(first.Path(dOld), past, past); err != nil {
		t.Fatal(err)
	}
	next, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { release(); first.Close(); next.Close() })
	if !next.Durable(dOld) {
		t.Fatal("a blob written back long ago was not marked by Open")
	}
	if next.Durable(dRecent) {
		t.Fatal("a blob written just now was marked by Open without waiting for the held flush")
	}
	if rec := next.Recovered(); rec.Flushed != 2 || rec.Rehashed != 0 {
		t.Fatalf("recovery %+v, want 2 flushed and none re-hashed", rec)
	}
	// After a restart only the recent, unmarked blob is re-hashed.
	reboot()
	after, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { after.Close() })
	if rec := after.Recovered(); rec.Rehashed != 1 {
		t.Fatalf("recovery after a restart %+v, want exactly the recent blob re-hashed", rec)
	}
}

// A big blob is flushed a chunk at a time, in order, each chunk followed by a flush of the disk's write cache (the
// barrier) before the next is written back, and another fsync on the same disk — a publish's metadata commit — is
// not queued behind the rest of it: held half way through the blob (a gate, not a clock), the flush lets a durable
// write of a record and the commit of another blob complete, and the blob is marked only after its last chunk and
// its fdatasync.
func TestFlushWritesBackInChunks(t *testing.T) {
	fakeBoot(t)
	s := open(t)
	old := flushChunk
	flushChunk = 4096
	t.Cleanup(func() { flushChunk = old })
	b := blob(4*4096 + 100)
	d := digest.FromBytes(b)
	path := s.Path(d)

	var mu sync.Mutex
	var ranges [][2]int64
	barriers := 0
	held, release := make(chan struct{}), make(chan struct{})
	hook := func(p string, off, n int64) {
		if p != path {
			return
		}
		mu.Lock()
		if barriers != len(ranges) {
			t.Errorf("chunk %d written back after %d cache flushes, want one after each earlier chunk", len(ranges), barriers)
		}
		ranges = append(ranges, [2]int64{off, n})
		second := len(ranges) == 2
		mu.Unlock()
		if second {
			close(held)
			<-release
		}
	}
	rangeHook.Store(&hook)
	t.Cleanup(func() { rangeHook.Store(nil) })
	syncs := recordSyncs(t, s.Root(), func(kind, p string) {
		if kind == "barrier" && p == path {
			mu.Lock()
			barriers++
			mu.Unlock()
		}
	})

	s.ingesting.Add(1) // hold the background flush: Sync below runs it
	if err := s.Ingest(context.Background(), d, int64(len(b)), (&source{blob: b}).open); err != nil {
		t.Fatal(err)
	}
	s.ingesting.Add(-1)
	synced := make(chan error, 1)
	go func() { synced <- s.Sync() }()
	select {
	case <-held:
	case err := <-synced:
		t.Fatalf("the flush ended (%v) without a second chunk: ranges %v", err, ranges)
	}

	if err := diskio.WriteFileAtomic(filepath.Join(t.TempDir(), "volume.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := blob(8192)
	if err := s.Ingest(context.Background(), digest.FromBytes(other), int64(len(other)), (&source{blob: other}).open); err != nil {
		t.Fatal(err)
	}
	if s.Durable(d) || slices.Contains(syncs(), "data "+path) {
		t.Fatalf("blob flushed or marked while its write-back was held after the first chunk: %v", syncs())
	}
	if !s.Flushing() {
		t.Fatal("Flushing reports no flush while one is held half way")
	}
	close(release)
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if s.Flushing() {
		t.Fatal("Flushing still reports a flush after Sync returned")
	}
	var next int64
	for _, r := range ranges {
		if r[0] != next || r[1] > flushChunk || r[1] <= 0 {
			t.Fatalf("write-back ranges %v: want consecutive chunks of at most %d bytes from 0", ranges, flushChunk)
		}
		next += r[1]
	}
	if next != int64(len(b)) || len(ranges) != 5 {
		t.Fatalf("write-back ranges %v cover %d bytes in %d chunks, want %d in 5", ranges, next, len(ranges), len(b))
	}
	if barriers != len(ranges) {
		t.Fatalf("%d cache flushes for %d chunks, want one after each", barriers, len(ranges))
	}
	if !s.Durable(d) || !slices.Contains(syncs(), "data "+path) {
		t.Fatalf("blob not flushed and marked after Sync: %v", syncs())
	}
}

// A symbolic link put where the flush barrier goes is not followed: nothing is created outside the store, the
// blobs are still flushed and marked, and Sync reports the barrier.
func TestFlushBarrierNeverFollowsALink(t *testing.T) {
	fakeBoot(t)
	s := open(t)
	outside := filepath.Join(t.TempDir(), "planted")
	barrier := filepath.Join(s.Root(), "ingest", "barrier")
	if err := os.Remove(barrier); err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, barrier); err != nil {
		t.Fatal(err)
	}
	b := blob(3 * 4096)
	d := digest.FromBytes(b)
	s.ingesting.Add(1) // hold the background flush: Sync below runs it
	if err := s.Ingest(context.Background(), d, int64(len(b)), (&source{blob: b}).open); err != nil {
		t.Fatal(err)
	}
	s.ingesting.Add(-1)
	err := s.Sync()
	if err == nil || !strings.Contains(err.Error(), "flush barrier") {
		t.Fatalf("Sync with a link for the barrier: %v, want the barrier reported", err)
	}
	if _, err := os.Lstat(outside); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the link's target outside the store exists after the flush (%v)", err)
	}
	if !s.Durable(d) {
		t.Fatal("blob not marked durable: the flush stopped at the barrier")
	}
}
