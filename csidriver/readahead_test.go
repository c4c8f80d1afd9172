package csidriver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/modelpack/modelpack/internal/readahead"
	"github.com/modelpack/modelpack/internal/testenv"
)

// A publish of a model the node holds on disk, but not in memory, has its files read into the page cache before
// the pod reads them; unpublishing the last volume of the view leaves it alone.
func TestPublishReadsTheVolumeAhead(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	b.push(testRef, "v1")
	rd, sock := startDriverWith(t, dir, b, func(o *Options) { o.Readahead = readahead.Fixed(1 << 30) })
	node := nodeClient(t, sock)
	ctx := context.Background()
	attrs := map[string]string{AttrReference: testRef}

	t1 := podTarget(t, dir, "p1")
	if _, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v1", t1, attrs)); err != nil {
		t.Fatal(err)
	}
	rd.d.Wait()
	// The model's weights grow to a real size, on disk and out of the page cache, as on a node after a restart.
	weights := filepath.Join(rd.d.state.Snapshot().Volumes[t1].Source, "model.safetensors")
	if err := os.WriteFile(weights, make([]byte, 24<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.EvictPages(t, weights)
	before := testutil.ToFloat64(rd.d.m.readaheadBytes)

	t2 := podTarget(t, dir, "p2")
	if _, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v2", t2, attrs)); err != nil {
		t.Fatal(err)
	}
	rd.d.Wait()
	testenv.WaitResident(t, filepath.Join(t2, "model.safetensors"))
	if got := testutil.ToFloat64(rd.d.m.readaheadBytes) - before; got < 24<<20 {
		t.Fatalf("readahead_bytes_total grew by %v, want the 24 MiB file and more", got)
	}
	for _, tgt := range []string{t1, t2} {
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: tgt}); err != nil {
			t.Fatal(err)
		}
	}
}
