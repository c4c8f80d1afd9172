package cache

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// gcFixture is a cache holding one pulled model, with GC set to evict whatever is unused.
func gcFixture(t *testing.T) (*Cache, *memTarget, ocispec.Descriptor) {
	t.Helper()
	src := newMemTarget()
	desc := src.manifestDesc(modelManifest(t, src, sampleModel(t, 1)))
	c := openCache(t, t.TempDir(), Options{MaxBytes: 1, MinAge: -1})
	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	return c, src, desc
}

// complete checks that the manifest is complete and every blob of it is in the store, verified.
func complete(t *testing.T, c *Cache, desc ocispec.Descriptor) {
	t.Helper()
	if !c.Has(desc.Digest) {
		t.Fatalf("manifest %s is not complete after the pull", desc.Digest)
	}
	r, err := c.Verify(context.Background())
	if err != nil || len(r.Problems) != 0 {
		t.Fatalf("verify: %+v %v", r.Problems, err)
	}
}

// A pull that needs again, after a collection decided to delete them, blobs the collection has not yet unlinked
// finds them present and fetches nothing; the collection then must delete none of them, or the pull's manifest
// would be complete with its blobs gone. The pull runs at the gate between GC's decision and its first unlink.
func TestGCSparesWhatAPullNeedsAgain(t *testing.T) {
	c, src, desc := gcFixture(t)
	ctx := context.Background()
	gets := func() int {
		src.mu.Lock()
		defer src.mu.Unlock()
		n := 0
		for _, k := range src.gets {
			n += k
		}
		return n
	}
	before := gets()
	var once sync.Once
	c.reaper.at = func(digest.Digest) {
		once.Do(func() {
			// GC has committed the eviction and released the index lock: the record is gone, the blobs are not.
			if _, _, err := c.Hold(desc.Digest); !errors.Is(err, ErrNotFound) {
				t.Errorf("Hold of the evicted manifest during the unlinks: %v, want ErrNotFound", err)
			}
			if _, err := c.Pull(ctx, src, desc, nil); err != nil {
				t.Errorf("pull during the unlinks: %v", err)
			}
		})
	}
	st, err := c.GC(ctx)
	c.reaper.at = nil
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Evicted) != 1 || st.Blobs != 0 {
		t.Fatalf("GC evicted %v and deleted %d blobs; want the manifest evicted and every blob spared", st.Evicted, st.Blobs)
	}
	if n := gets() - before; n != 0 {
		t.Fatalf("the pull fetched %d blobs; want none (all were still in the store)", n)
	}
	complete(t, c, desc)
	// Nothing is left doomed: the next collection decides afresh (and evicts the model, unused again).
	if st, err := c.GC(ctx); err != nil || len(st.Evicted) != 1 || st.Blobs == 0 {
		t.Fatalf("the next GC: %+v %v", st, err)
	}
}

// A pull that needs again a blob the collection already unlinked fetches it again: the gate lets one unlink run
// before the pull, which must end with every blob present.
func TestGCPullRefetchesWhatWasAlreadyUnlinked(t *testing.T) {
	c, src, desc := gcFixture(t)
	ctx := context.Background()
	var first digest.Digest
	calls := 0
	c.reaper.at = func(d digest.Digest) {
		calls++
		switch calls {
		case 1:
			first = d
		case 2:
			if _, err := c.blobs.Stat(first); err == nil {
				t.Errorf("blob %s still there after its unlink", first)
			}
			if _, err := c.Pull(ctx, src, desc, nil); err != nil {
				t.Errorf("pull during the unlinks: %v", err)
			}
		}
	}
	st, err := c.GC(ctx)
	c.reaper.at = nil
	if err != nil {
		t.Fatal(err)
	}
	if calls < 2 || st.Blobs != 1 {
		t.Fatalf("GC reached its gate %d times and deleted %d blobs; want exactly the first one deleted", calls, st.Blobs)
	}
	complete(t, c, desc)
}

// While a collection unlinks, the index lock is free: a warm publish (Hold, Acquire by a new volume, Release) of a
// model the collection keeps, the usage report and a pull of another model all complete with GC held at its
// gate. Before the split they waited behind every unlink; here they would deadlock.
func TestGCUnlinksOutsideTheIndexLock(t *testing.T) {
	src := newMemTarget()
	kept := src.manifestDesc(modelManifest(t, src, sampleModel(t, 1)))
	gone := src.manifestDesc(modelManifest(t, src, sampleModel(t, 7)))
	other := src.manifestDesc(modelManifest(t, src, sampleModel(t, 13)))
	c := openCache(t, t.TempDir(), Options{MaxBytes: 1, MinAge: -1})
	ctx := context.Background()
	for _, d := range []ocispec.Descriptor{kept, gone} {
		if _, err := c.Pull(ctx, src, d, nil); err != nil {
			t.Fatal(err)
		}
	}
	// A pin keeps one model through the collection.
	if _, err := c.Acquire("pin:kept", kept.Digest, Selector{}); err != nil {
		t.Fatal(err)
	}
	reached, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c.reaper.at = func(digest.Digest) {
		once.Do(func() {
			close(reached)
			<-resume
		})
	}
	done := make(chan error, 1)
	var st GCStats
	go func() {
		var err error
		st, err = c.GC(ctx)
		done <- err
	}()
	<-reached
	m, release, err := c.Hold(kept.Digest)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := c.Acquire("vol-1", m, Selector{})
	release()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		t.Fatalf("the view of the kept model: %v", err)
	}
	if err := c.Release("vol-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Usage(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pull(ctx, src, other, nil); err != nil {
		t.Fatal(err)
	}
	close(resume)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c.reaper.at = nil
	if len(st.Evicted) != 1 || st.Evicted[0] != gone.Digest || st.Blobs == 0 {
		t.Fatalf("GC: %+v; want %s evicted and its blobs deleted", st, gone.Digest)
	}
	complete(t, c, kept)
	complete(t, c, other)
}
