package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	digest "github.com/opencontainers/go-digest"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/testenv"
)

// rehashes counts the re-hashes of blobs, by digest, while a test runs.
type rehashes struct {
	mu sync.Mutex
	n  map[digest.Digest]int
}

func countRehashes(t *testing.T) *rehashes {
	r := &rehashes{n: map[digest.Digest]int{}}
	t.Cleanup(cas.SetCheckHookForTesting(func(d digest.Digest, event string) {
		if event == "rehash" {
			r.mu.Lock()
			r.n[d]++
			r.mu.Unlock()
		}
	}))
	return r
}

func (r *rehashes) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, k := range r.n {
		n += k
	}
	return n
}

// A same-size byte flip in a cached shard, written with dd conv=notrunc while the cache was closed (a clean
// restart) or while it runs, through the blob or through a view's hardlink of it, with or without its mtime put
// back: the next use re-hashes that blob (its stamp changed), quarantines it, drops the views built from it, and
// the next pull fetches it again; the new view shows the right bytes.
func TestFlipIsCaughtOnUseWhateverTheRestart(t *testing.T) {
	for _, tc := range []struct {
		name              string
		restart, viaView  bool
		keepMtime, always bool
	}{
		{name: "clean restart, blob", restart: true},
		{name: "clean restart, blob, mtime restored", restart: true, keepMtime: true},
		{name: "clean restart, view file, mtime restored", restart: true, viaView: true, keepMtime: true},
		{name: "while running, blob, mtime restored", keepMtime: true},
		{name: "while running, view file, pull (Always)", viaView: true, always: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, src, desc, weights, logs := damageFixture(t, Options{})
			d := digest.FromBytes(weights)
			view, err := c.Acquire("vol-0", desc.Digest, Selector{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.restart {
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
			}
			target := c.blobs.Path(d)
			if tc.viaView {
				target = filepath.Join(view, "a.safetensors")
			}
			testenv.FlipByte(t, target, 4097, tc.keepMtime)
			if tc.restart {
				c = openCache(t, c.root, Options{Logger: c.log})
				if c.unclean.Load() {
					t.Fatal("a clean Close was taken for a crash")
				}
			}
			seen := countRehashes(t)
			before := src.gets[d]
			if tc.always {
				// pullPolicy Always: the driver resolves the tag and pulls, which finds the manifest in the cache.
				if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
					t.Fatal(err)
				}
			} else if c.Has(desc.Digest) {
				t.Fatal("a manifest with a flipped byte is complete: the flip would be mounted")
			}
			if seen.n[d] != 1 {
				t.Errorf("the flipped blob was re-hashed %d times on use, want 1", seen.n[d])
			}
			if _, err := os.Stat(filepath.Join(c.root, "quarantine", "sha256-"+d.Encoded())); err != nil {
				t.Errorf("not quarantined: %v", err)
			}
			if got := testutil.ToFloat64(c.m.corruptBlobs.WithLabelValues("digest")); got != 1 {
				t.Errorf("corrupt_blobs_total{problem=digest} = %v, want 1", got)
			}
			if !strings.Contains(logs.String(), d.String()) {
				t.Errorf("no log line names the damaged blob:\n%s", logs.String())
			}
			if _, err := os.Stat(view); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the view built from the flipped blob is kept: %v", err)
			}
			if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
				t.Fatal(err)
			}
			if src.gets[d] != before+1 {
				t.Errorf("the flipped blob was fetched %d times again, want 1", src.gets[d]-before)
			}
			dir, err := c.Acquire("vol-1", desc.Digest, Selector{})
			if err != nil {
				t.Fatal(err)
			}
			if got, err := os.ReadFile(filepath.Join(dir, "a.safetensors")); err != nil || !bytes.Equal(got, weights) {
				t.Fatalf("the new view does not show the right bytes (%v)", err)
			}
		})
	}
}

// The warm path stays a stat per blob: after a clean restart, uses, new views, and the deletion of views (which
// change the blobs' link counts, and so their ctimes) re-hash nothing.
func TestWarmUseRehashesNothing(t *testing.T) {
	c, _, desc, _, _ := damageFixture(t, Options{})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c = openCache(t, c.root, Options{})
	seen := countRehashes(t)
	for i := range 3 {
		if !c.Has(desc.Digest) {
			t.Fatal("not complete after a clean restart")
		}
		owner := fmt.Sprintf("sel-%d", i)
		if _, err := c.Acquire(owner, desc.Digest, Selector{Include: []string{"*.safetensors", fmt.Sprintf("x%d", i)}}); err != nil {
			t.Fatal(err)
		}
		if err := c.Release(owner); err != nil {
			t.Fatal(err)
		}
		if st, err := c.GC(context.Background()); err != nil || st.Views != 1 {
			t.Fatalf("gc deleted %d views (%v), want the released selector view", st.Views, err)
		}
	}
	if _, err := c.Acquire("vol-9", desc.Digest, Selector{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c = openCache(t, c.root, Options{})
	if !c.Has(desc.Digest) {
		t.Fatal("not complete after a second clean restart")
	}
	if n := seen.total(); n != 0 {
		t.Fatalf("%d blobs re-hashed on the warm path (%v), want 0", n, seen.n)
	}
}

// forgeStamp makes a blob's recorded stamp match its file again, as if the change had bypassed the file system
// (a write to the block device, bit rot): what a stamp cannot see. The cache must be closed.
func forgeStamp(t *testing.T, root string, d digest.Digest) {
	t.Helper()
	fi, err := os.Stat(filepath.Join(root, "blobs", "sha256", d.Encoded()))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "ingest", "stamps", "sha256-"+d.Encoded()), []byte(cas.StampOf(fi).String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// After an unclean start every blob is suspect: a use that needs one waits for its re-hash (here the scrub's,
// held by a gate) and never passes it on its stamp, even one that matches.
func TestUncleanStartUseWaitsForTheBlobsRehash(t *testing.T) {
	c, _, desc, weights, _ := damageFixture(t, Options{})
	d := digest.FromBytes(weights)
	root := c.root
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	testenv.FlipByte(t, filepath.Join(root, "blobs", "sha256", d.Encoded()), 10, true)
	forgeStamp(t, root, d)
	if err := os.WriteFile(filepath.Join(root, runningFile), nil, 0o644); err != nil { // what a SIGKILL leaves
		t.Fatal(err)
	}
	// The first re-hash of d, whoever runs it (the scrub or the use), is held until the use is seen waiting on it.
	held, waiting, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once, onceWait sync.Once
	t.Cleanup(cas.SetCheckHookForTesting(func(got digest.Digest, event string) {
		if got != d {
			return
		}
		switch event {
		case "rehash":
			first := false
			once.Do(func() { first = true })
			if first {
				close(held)
				<-release
			}
		case "wait":
			onceWait.Do(func() { close(waiting) })
		}
	}))
	scrubbed := make(chan VerifyReport, 1)
	h := &hooks{}
	set(t, &h.backgroundVerify, func(r VerifyReport, err error) { scrubbed <- r })
	c = openCache(t, root, Options{hooks: h})
	has := make(chan bool, 1)
	go func() { has <- c.Has(desc.Digest) }()
	// Both the scrub and the use come to d's one re-hash, held; a use that does not wait for it returns first.
	for _, ch := range []chan struct{}{held, waiting} {
		select {
		case <-ch:
		case ok := <-has:
			close(release)
			t.Fatalf("the use passed blob %s (complete=%v) while its re-hash after an unclean start was pending", d, ok)
		}
	}
	close(release)
	if <-has {
		t.Fatal("a blob flipped beneath its stamp was served after an unclean start")
	}
	if _, err := os.Stat(filepath.Join(root, "quarantine", "sha256-"+d.Encoded())); err != nil {
		t.Errorf("not quarantined: %v", err)
	}
	<-scrubbed
	if n := c.blobs.Suspects(); n != 0 {
		t.Errorf("%d blobs still suspect after the scrub", n)
	}
	if got := testutil.ToFloat64(c.m.corruptBlobs.WithLabelValues("digest")); got != 1 {
		t.Errorf("corrupt_blobs_total{problem=digest} = %v, want 1 (one repair, whoever found it)", got)
	}
}

// The scrub finds what no stamp sees, on a thread at idle I/O priority and nice 19, and reports its progress and
// findings in its metrics.
func TestScrubFindsWhatStampsCannotSee(t *testing.T) {
	c, _, desc, weights, _ := damageFixture(t, Options{})
	d := digest.FromBytes(weights)
	root := c.root
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	testenv.FlipByte(t, filepath.Join(root, "blobs", "sha256", d.Encoded()), 10, true)
	forgeStamp(t, root, d)
	c = openCache(t, root, Options{})
	if !c.Has(desc.Digest) {
		t.Fatal("the forged stamp was not taken at its word: this test no longer shows what the scrub is for")
	}
	var class, nice int
	set(t, &c.hooks.scrub, func(err error) {
		if err != nil {
			t.Errorf("lowering the scrub's priorities: %v", err)
		}
		const ioprioWhoProcess = 1
		v, _, _ := unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, 0, 0)
		class = int(v) >> 13
		p, _ := unix.Getpriority(unix.PRIO_PROCESS, 0)
		nice = 20 - p
	})
	var total int64
	c.blobs.Walk(func(_ digest.Digest, n int64) error { total += n; return nil })
	r, err := c.scrub(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if class != 3 || nice != 19 {
		t.Errorf("the scrub ran at I/O class %d and nice %d, want 3 (idle) and 19", class, nice)
	}
	if len(r.Repaired) != 1 || r.Repaired[0] != d {
		t.Fatalf("scrub repaired %v, want [%s]", r.Repaired, d)
	}
	if c.Has(desc.Digest) {
		t.Fatal("still complete after the scrub found the flip")
	}
	if got := testutil.ToFloat64(c.m.scrubBytes); got != float64(total) {
		t.Errorf("scrub_bytes_total = %v, want %d", got, total)
	}
	if got := testutil.ToFloat64(c.m.scrubCorrupt); got != 1 {
		t.Errorf("scrub_corrupt_blobs_total = %v, want 1", got)
	}
	if got := testutil.ToFloat64(c.m.scrubLastCompletion); got == 0 {
		t.Error("scrub_last_completion_timestamp_seconds not set")
	}
	// Its own thread carried the priorities away: this one is untouched.
	if p, _ := unix.Getpriority(unix.PRIO_PROCESS, 0); 20-p != 0 {
		t.Errorf("the test's thread runs at nice %d", 20-p)
	}
}

// A byte flipped in a file of an extracted tar layer (through the layer or through a view, mtime put back, after
// a clean restart or while running) is seen by the next Acquire: the layer and the views built from it are
// deleted and it is extracted again from its blob, so the new view reads the right bytes; the old view never
// shows the flipped ones again. Uses, new views and view deletions alone extract nothing again.
func TestFlippedExtractedFileIsExtractedAgain(t *testing.T) {
	for _, tc := range []struct {
		name             string
		restart, viaView bool
	}{
		{"clean restart, layer file", true, false},
		{"while running, view file", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, desc, _, _ := damageFixture(t, Options{})
			view, err := c.Acquire("vol-0", desc.Digest, Selector{})
			if err != nil {
				t.Fatal(err)
			}
			// The warm path first: a selector view built and deleted, a restart: nothing is extracted again.
			if _, err := c.Acquire("sel", desc.Digest, Selector{Include: []string{"code/**"}}); err != nil {
				t.Fatal(err)
			}
			c.Release("sel")
			if st, err := c.GC(context.Background()); err != nil || st.Views != 1 {
				t.Fatalf("gc deleted %d views (%v), want 1", st.Views, err)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			c = openCache(t, c.root, Options{Logger: c.log})
			if _, err := c.Acquire("vol-0", desc.Digest, Selector{}); err != nil {
				t.Fatal(err)
			}
			if n := testutil.ToFloat64(c.m.extractions); n != 0 {
				t.Fatalf("%v layers extracted again on the warm path", n)
			}
			if tc.restart {
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
			}
			var layer digest.Digest
			for _, e := range mustDir(t, filepath.Join(c.root, "layers", "sha256")) {
				layer = digest.NewDigestFromEncoded(digest.SHA256, e)
			}
			target := filepath.Join(c.layerDir(layer), "code", "run.py")
			if tc.viaView {
				target = filepath.Join(view, "code", "run.py")
			}
			testenv.FlipByte(t, target, 2, true)
			if tc.restart {
				c = openCache(t, c.root, Options{Logger: c.log})
			}
			dir, err := c.Acquire("vol-1", desc.Digest, Selector{})
			if err != nil {
				t.Fatal(err)
			}
			if got, err := os.ReadFile(filepath.Join(dir, "code", "run.py")); err != nil || string(got) != "print(1)\n" {
				t.Fatalf("the new view reads %q (%v), want the layer's bytes", got, err)
			}
			if got, err := os.ReadFile(filepath.Join(view, "code", "run.py")); err == nil && string(got) != "print(1)\n" {
				t.Fatalf("the old view still reads the flipped file: %q", got)
			}
			if n := testutil.ToFloat64(c.m.extractions); n != 1 {
				t.Errorf("%v extractions, want 1", n)
			}
			if n := testutil.ToFloat64(c.m.corruptBlobs.WithLabelValues("extracted")); n != 1 {
				t.Errorf("corrupt_blobs_total{problem=extracted} = %v, want 1", n)
			}
			// And the new extraction's own stamps hold: the next use changes nothing.
			if _, err := c.Acquire("vol-2", desc.Digest, Selector{}); err != nil {
				t.Fatal(err)
			}
			if n := testutil.ToFloat64(c.m.extractions); n != 1 {
				t.Errorf("%v extractions after one more use, want 1", n)
			}
		})
	}
}

func mustDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}
