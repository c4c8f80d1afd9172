package layout_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	digest "github.com/opencontainers/go-digest"
)

// Prune also deletes what abandoned pulls left under ingest/: partial downloads and lock files. Pushes leave no
// lock files behind in the first place.
func TestPruneDropsPartialsAndLocks(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	packSample(t, s, "m:a", 1)
	if locks, _ := filepath.Glob(filepath.Join(s.Root(), "ingest", "*.lock")); len(locks) != 0 {
		t.Fatalf("lock files left by a pack: %v", locks)
	}
	blobs, err := s.Blobs()
	if err != nil {
		t.Fatal(err)
	}
	// An abandoned pull: half a blob and its lock.
	data := bytes.Repeat([]byte("x"), 1<<20)
	d := digest.FromBytes(data)
	cut := func(context.Context, int64) (io.ReadCloser, int64, error) {
		return io.NopCloser(bytes.NewReader(data[:len(data)/2])), 0, nil
	}
	if err := blobs.Ingest(ctx, d, int64(len(data)), cut); err == nil {
		t.Fatal("a short ingest succeeded")
	}
	if p, _ := blobs.Partials(); p[d] == 0 {
		t.Fatal("no partial to prune")
	}
	s.Close()
	if _, err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	left, _ := os.ReadDir(filepath.Join(s.Root(), "ingest"))
	for _, e := range left {
		if filepath.Ext(e.Name()) == ".partial" || filepath.Ext(e.Name()) == ".lock" {
			t.Errorf("prune kept %s", e.Name())
		}
	}
}
