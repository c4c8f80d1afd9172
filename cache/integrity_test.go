package cache

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus/testutil"
	bolt "go.etcd.io/bbolt"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/cas"
)

// syncBuffer is a log destination tests read while the cache writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// damageFixture pulls a model of two raw shards and a tar layer and returns what a test needs to damage it.
func damageFixture(t *testing.T, opts Options) (c *Cache, src *memTarget, desc ocispec.Descriptor, weights []byte, logs *syncBuffer) {
	t.Helper()
	src = newMemTarget()
	weights = shard(71, 256<<10)
	files := []modelFile{
		{Path: "a.safetensors", Data: weights},
		{Path: "b.safetensors", Data: shard(72, 128<<10)},
		{Path: "code", Data: makeTar(t, false, tarEntry{Name: "code/run.py", Body: "print(1)\n"}), Kind: artifact.KindCode, Format: artifact.FormatTar},
	}
	desc = src.manifestDesc(modelManifest(t, src, files))
	logs = &syncBuffer{}
	opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
	c = openCache(t, t.TempDir(), opts)
	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire("vol-0", desc.Digest, Selector{}); err != nil {
		t.Fatal(err)
	}
	return c, src, desc, weights, logs
}

// rewrite replaces a committed (read-only) blob's bytes in place, as a disk error or a person would: the inode
// stays, so every view hardlinking it sees the change.
func rewrite(t *testing.T, path string, change func([]byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(path, 0o644)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(change(b)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Chmod(path, 0o444)
}

// A truncated blob is never mounted: the cheap check on use (a stat) takes it out of use, the next publish pulls
// it again, and a new view shows the right bytes.
func TestTruncatedBlobIsNotServedAndIsPulledAgain(t *testing.T) {
	c, src, desc, weights, logs := damageFixture(t, Options{})
	d := digest.FromBytes(weights)
	rewrite(t, c.blobs.Path(d), func(b []byte) []byte { return b[:len(b)/2] })

	if c.Has(desc.Digest) {
		t.Fatal("a manifest with a truncated blob is complete")
	}
	if _, err := c.Acquire("vol-1", desc.Digest, Selector{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("acquire of a manifest with a truncated blob: %v, want ErrNotFound", err)
	}
	if got := testutil.ToFloat64(c.m.corruptBlobs.WithLabelValues("size")); got != 1 {
		t.Errorf("corrupt_blobs_total{problem=size} = %v, want 1", got)
	}
	if !strings.Contains(logs.String(), "damaged") || !strings.Contains(logs.String(), d.String()) {
		t.Errorf("no log line names the damaged blob:\n%s", logs.String())
	}
	if _, err := os.Stat(filepath.Join(c.root, "quarantine", "sha256-"+d.Encoded())); err != nil {
		t.Errorf("not quarantined: %v", err)
	}
	before := src.gets[d]
	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	if src.gets[d] != before+1 {
		t.Errorf("the damaged blob was fetched %d times again, want 1", src.gets[d]-before)
	}
	dir, err := c.Acquire("vol-1", desc.Digest, Selector{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "a.safetensors")); err != nil || !bytes.Equal(got, weights) {
		t.Fatalf("the new view does not show the right bytes (%v)", err)
	}
	// A deleted blob is caught the same way, by Pull's own check (pullPolicy Always).
	if err := os.Remove(c.blobs.Path(d)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	if ok, _ := c.blobs.Exists(d, int64(len(weights))); !ok {
		t.Fatal("a missing blob was not pulled again")
	}
}

// A flipped byte keeps the size: the full re-hash (Repair, i.e. cache verify --repair) finds it, quarantines the
// blob, drops the views built from it, and the next publish pulls it again.
func TestRepairQuarantinesAFlippedByte(t *testing.T) {
	c, src, desc, weights, _ := damageFixture(t, Options{})
	d := digest.FromBytes(weights)
	rewrite(t, c.blobs.Path(d), func(b []byte) []byte { b[1000] ^= 0x40; return b })
	r, err := c.Repair(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Repaired) != 1 || r.Repaired[0] != d {
		t.Fatalf("repaired %v, want [%s]", r.Repaired, d)
	}
	if c.Has(desc.Digest) {
		t.Fatal("still complete after repair")
	}
	if views, _ := os.ReadDir(filepath.Join(c.root, "views")); len(views) != 0 {
		t.Fatalf("views of the bad blob kept: %v", views)
	}
	if got := testutil.ToFloat64(c.m.corruptBlobs.WithLabelValues("digest")); got != 1 {
		t.Errorf("corrupt_blobs_total{problem=digest} = %v, want 1", got)
	}
	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	dir, err := c.Acquire("vol-1", desc.Digest, Selector{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "a.safetensors")); !bytes.Equal(got, weights) {
		t.Fatal("wrong bytes after repair and pull")
	}
	if r, err := c.Verify(context.Background()); err != nil || len(r.Problems) != 0 {
		t.Fatalf("verify after repair: %+v %v", r, err)
	}
	// gc purges the quarantine.
	if _, err := c.GC(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(filepath.Join(c.root, "quarantine")); len(left) != 0 {
		t.Errorf("quarantine kept after gc: %v", left)
	}
}

// A cache that was not closed (the process was killed) is fully re-hashed in the background after Open; one
// closed cleanly is not, and the marker is kept until that verification has completed.
func TestUncleanStartVerifiesEveryBlob(t *testing.T) {
	src := newMemTarget()
	weights := shard(73, 64<<10)
	desc := src.manifestDesc(modelManifest(t, src, []modelFile{{Path: "w.safetensors", Data: weights}}))
	root := t.TempDir()
	c, err := Open(Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, runningFile)); err != nil {
		t.Fatalf("no running marker while open: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, runningFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("running marker left by a clean Close: %v", err)
	}
	d := digest.FromBytes(weights)
	rewrite(t, filepath.Join(root, "blobs", "sha256", d.Encoded()), func(b []byte) []byte { b[0] ^= 1; return b })
	// What a killed process leaves behind.
	if err := os.WriteFile(filepath.Join(root, runningFile), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan VerifyReport, 1)
	h := &hooks{}
	set(t, &h.backgroundVerify, func(r VerifyReport, err error) {
		if err != nil {
			t.Error(err)
		}
		done <- r
	})
	c2 := openCache(t, root, Options{hooks: h})
	select {
	case r := <-done:
		if len(r.Repaired) != 1 || r.Repaired[0] != d {
			t.Fatalf("background verification repaired %v, want [%s]", r.Repaired, d)
		}
	case <-time.After(time.Minute):
		t.Fatal("no verification after an unclean start")
	}
	if c2.Has(desc.Digest) {
		t.Fatal("a manifest with a corrupt blob is still complete after the unclean start's verification")
	}
}

// Partial downloads of a pull every caller abandoned are deleted once they have sat untouched for the pull linger,
// with no size limit set; fresh ones (a pull that may resume) stay. A pull leaves no lock files behind.
func TestAbandonedPartialsAreDroppedAfterTheirLinger(t *testing.T) {
	src := newMemTarget()
	data := shard(74, 512<<10)
	desc := src.manifestDesc(modelManifest(t, src, []modelFile{{Path: "w.safetensors", Data: data}}))
	d := digest.FromBytes(data)
	c := openCache(t, t.TempDir(), Options{PullLinger: time.Hour})
	// A pull that broke off half way: its bytes stay for a retry to resume.
	good := src.blobs[d]
	src.put(d, good[:len(good)/2])
	if _, err := c.Pull(context.Background(), src, desc, nil); err == nil {
		t.Fatal("pull of a short blob succeeded")
	}
	src.put(d, good)
	partial := filepath.Join(c.root, "ingest", "sha256-"+d.Encoded()+".partial")
	if _, err := os.Stat(partial); err != nil {
		t.Fatalf("no partial kept for a resume: %v", err)
	}
	if n := c.dropStalePartials(time.Now()); n != 0 {
		t.Fatalf("dropped %d fresh partials", n)
	}
	if st, err := c.GC(context.Background()); err != nil || st.Partials != 0 {
		t.Fatalf("gc dropped a fresh partial: %+v %v", st, err)
	}
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(partial, old, old); err != nil {
		t.Fatal(err)
	}
	// No size limit: GC evicts nothing, but an abandoned partial goes.
	st, err := c.GC(context.Background())
	if err != nil || st.Partials != 1 {
		t.Fatalf("gc with no size limit: %+v %v", st, err)
	}
	if _, err := os.Stat(partial); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("abandoned partial kept: %v", err)
	}
	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	if locks, _ := filepath.Glob(filepath.Join(c.root, "ingest", "*.lock")); len(locks) != 0 {
		t.Fatalf("lock files left after a pull: %v", locks)
	}
}

// After a restart of the machine, nothing that had not reached the disk is served: a blob without its durable mark
// is re-hashed (and, bad, quarantined and pulled again), an extracted layer without its mark is extracted again,
// and the views built from either are rebuilt; the manifest is never mounted half.
func TestRestartOfTheMachineDropsWhatWasNotFlushed(t *testing.T) {
	bootFile := filepath.Join(t.TempDir(), "boot_id")
	os.WriteFile(bootFile, []byte("boot-1\n"), 0o644)
	t.Cleanup(cas.FakeBootIDForTesting(bootFile))
	src := newMemTarget()
	weights := shard(75, 256<<10)
	code := makeTar(t, false, tarEntry{Name: "code/run.py", Body: "print(1)\n"})
	desc := src.manifestDesc(modelManifest(t, src, []modelFile{
		{Path: "w.safetensors", Data: weights},
		{Path: "code", Data: code, Kind: artifact.KindCode, Format: artifact.FormatTar},
	}))
	root := t.TempDir()
	c, err := Open(Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire("vol", desc.Digest, Selector{}); err != nil {
		t.Fatal(err)
	}
	// Stage the power loss: the shard's and the layer's flushes had not completed (no marks), and the shard's
	// bytes never reached the disk.
	c.layerFlusher.Flush()
	dw, dc := digest.FromBytes(weights), digest.FromBytes(code)
	if err := c.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketDurableLayers).Delete([]byte(dc)) }); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(root, "ingest", "durable", "sha256-"+dw.Encoded()))
	rewrite(t, filepath.Join(root, "blobs", "sha256", dw.Encoded()), func(b []byte) []byte { return make([]byte, len(b)) })
	os.WriteFile(bootFile, []byte("boot-2\n"), 0o644)

	c2 := openCache(t, root, Options{})
	if c2.Has(desc.Digest) {
		t.Fatal("a manifest with a blob lost to the power cut is complete")
	}
	if _, err := os.Stat(c2.layerDir(dc)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("unflushed extracted layer kept: %v", err)
	}
	if views, _ := os.ReadDir(filepath.Join(root, "views")); len(views) != 0 {
		t.Fatalf("views built from unflushed content kept: %v", views)
	}
	if got := testutil.ToFloat64(c2.m.corruptBlobs.WithLabelValues("digest")); got != 1 {
		t.Errorf("corrupt_blobs_total{problem=digest} = %v, want 1", got)
	}
	if _, err := c2.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	dir, err := c2.Acquire("vol", desc.Digest, Selector{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "w.safetensors")); !bytes.Equal(got, weights) {
		t.Fatal("wrong weights after the restart")
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "code", "run.py")); string(got) != "print(1)\n" {
		t.Fatalf("code after the restart: %q", got)
	}
}
