package cache

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	digest "github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"

	"github.com/modelpack/modelpack/artifact"
)

// holdIngest keeps an ingest of the cache's blob store under way until the returned release is called: the
// background flushers wait while one runs, so whatever is added meanwhile joins one batch, whatever the clock says.
func holdIngest(t *testing.T, c *Cache) (release func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	started, done := make(chan struct{}), make(chan struct{})
	b := shard(99, 4096)
	go func() {
		defer close(done)
		c.Blobs().Ingest(ctx, digest.FromBytes(b), int64(len(b)), func(ctx context.Context, _ int64) (io.ReadCloser, int64, error) {
			close(started)
			<-ctx.Done()
			return nil, 0, ctx.Err()
		})
	}()
	<-started
	release = func() { cancel(); <-done }
	t.Cleanup(release)
	return release
}

// durableLayers reports which of ds carry a durable mark.
func durableLayers(t *testing.T, c *Cache, ds ...digest.Digest) []bool {
	t.Helper()
	out := make([]bool, len(ds))
	if err := c.db.View(func(tx *bolt.Tx) error {
		for i, d := range ds {
			out[i] = tx.Bucket(bucketDurableLayers).Get([]byte(d)) != nil
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// gateSyncfs counts the syncfs of c's layers (its own hook: not those of other tests' caches flushing late) and holds the first
// one, completed but before its marks, until release (also at cleanup); at runs after each with its number, before
// its marks (and before the hold). The returned channel closes when the first is held.
func gateSyncfs(t *testing.T, c *Cache, at func(n int)) (held <-chan struct{}, release func(), count func() int) {
	t.Helper()
	var n atomic.Int32
	first, gate := make(chan struct{}), make(chan struct{})
	hook := func(root string) {
		i := int(n.Add(1))
		at(i)
		if i == 1 {
			close(first)
			<-gate
		}
	}
	set(t, &c.hooks.syncFS, hook)
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return first, release, func() int { return int(n.Load()) }
}

// Layers extracted close together share one syncfs, marked only after it; a layer extracted while that syncfs
// runs is not vouched for by it, but by the next one.
func TestLayersExtractedTogetherShareOneSyncfs(t *testing.T) {
	src := newMemTarget()
	tarLayer := func(name string) []byte { return makeTar(t, false, tarEntry{Name: name, Body: name + "\n"}) }
	a1, a2, b1 := tarLayer("code/a1.py"), tarLayer("code/a2.py"), tarLayer("code/b1.py")
	descA := src.manifestDesc(modelManifest(t, src, []modelFile{
		{Path: "code-a1", Data: a1, Kind: artifact.KindCode, Format: artifact.FormatTar},
		{Path: "code-a2", Data: a2, Kind: artifact.KindCode, Format: artifact.FormatTar},
	}))
	descB := src.manifestDesc(modelManifest(t, src, []modelFile{
		{Path: "code-b1", Data: b1, Kind: artifact.KindCode, Format: artifact.FormatTar},
	}))
	da1, da2, db1 := digest.FromBytes(a1), digest.FromBytes(a2), digest.FromBytes(b1)
	c, err := Open(Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var atSecond []bool
	firstDone, openGate, syncs := gateSyncfs(t, c, func(n int) {
		switch n {
		case 1:
			if got := durableLayers(t, c, da1, da2); got[0] || got[1] {
				t.Errorf("layers marked durable before their syncfs completed: %v", got)
			}
		case 2:
			atSecond = durableLayers(t, c, da1, da2, db1)
		}
	})
	defer openGate() // before the deferred Close, whose flush waits for the held one

	release := holdIngest(t, c)
	if _, err := c.Pull(context.Background(), src, descA, nil); err != nil {
		t.Fatal(err)
	}
	release()
	<-firstDone // the batch of a1 and a2, flushed once idle
	// Extracted while that syncfs runs: it must wait for the next one.
	if _, err := c.Pull(context.Background(), src, descB, nil); err != nil {
		t.Fatal(err)
	}
	openGate()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if syncs() != 2 {
		t.Fatalf("%d syncfs for three layers extracted in two bursts, want 2", syncs())
	}
	if want := []bool{true, true, false}; atSecond == nil || atSecond[0] != want[0] || atSecond[1] != want[1] || atSecond[2] != want[2] {
		t.Fatalf("durable marks of a1, a2, b1 when the second syncfs completed: %v, want %v", atSecond, want)
	}
	c2 := openCache(t, c.Root(), Options{})
	if got := durableLayers(t, c2, da1, da2, db1); !got[0] || !got[1] || !got[2] {
		t.Fatalf("durable marks after Close: %v", got)
	}
}

// A layer deleted (GC) and extracted again while the syncfs of its first extraction runs is not marked durable by
// that syncfs's batch: the new files were written after it began. The next flush marks it.
func TestLayerExtractedAgainIsNotVouchedForByTheEarlierFlush(t *testing.T) {
	src := newMemTarget()
	code := makeTar(t, false, tarEntry{Name: "code/run.py", Body: "print(1)\n"})
	desc := src.manifestDesc(modelManifest(t, src, []modelFile{
		{Path: "code", Data: code, Kind: artifact.KindCode, Format: artifact.FormatTar},
	}))
	dc := digest.FromBytes(code)
	c, err := Open(Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var atSecond []bool
	firstDone, openGate, syncs := gateSyncfs(t, c, func(n int) {
		if n == 2 {
			atSecond = durableLayers(t, c, dc)
		}
	})
	defer openGate() // before the deferred Close, whose flush waits for the held one

	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	<-firstDone // the first extraction's syncfs completed; its marks are held back
	if err := c.Remove(desc.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(c.layerDir(dc)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("layer not deleted by Remove: %v", err)
	}
	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	openGate()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if syncs() != 2 || atSecond == nil || atSecond[0] {
		t.Fatalf("%d syncfs; layer marked durable before the syncfs of its second extraction: %v", syncs(), atSecond)
	}
	c2 := openCache(t, c.Root(), Options{})
	if got := durableLayers(t, c2, dc); !got[0] {
		t.Fatal("second extraction not marked durable after its flush")
	}
}
