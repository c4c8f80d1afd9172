package cache

import (
	"context"
	"io"
	"sync"
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

	var syncs int
	firstDone, gate := make(chan struct{}), make(chan struct{})
	var atSecond []bool
	hook := func() {
		syncs++ // flushes run one at a time
		switch syncs {
		case 1:
			if got := durableLayers(t, c, da1, da2); got[0] || got[1] {
				t.Errorf("layers marked durable before their syncfs completed: %v", got)
			}
			close(firstDone)
			<-gate
		case 2:
			atSecond = durableLayers(t, c, da1, da2, db1)
		}
	}
	syncFSHook.Store(&hook)
	t.Cleanup(func() { syncFSHook.Store(nil) })
	var opened sync.Once
	openGate := func() { opened.Do(func() { close(gate) }) }
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
	if syncs != 2 {
		t.Fatalf("%d syncfs for three layers extracted in two bursts, want 2", syncs)
	}
	if want := []bool{true, true, false}; atSecond == nil || atSecond[0] != want[0] || atSecond[1] != want[1] || atSecond[2] != want[2] {
		t.Fatalf("durable marks of a1, a2, b1 when the second syncfs completed: %v, want %v", atSecond, want)
	}
	c2 := openCache(t, c.Root(), Options{})
	if got := durableLayers(t, c2, da1, da2, db1); !got[0] || !got[1] || !got[2] {
		t.Fatalf("durable marks after Close: %v", got)
	}
}
