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

// The readahead of a view goes on while a volume still mounts it, and stops when the last one is unpublished.
func TestReadaheadStopsWithTheViewsLastVolume(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	b.push(testRef, "v1")
	rd, sock := startDriverWith(t, dir, b, func(o *Options) { o.Readahead = readahead.Fixed(1 << 30) })
	started, release := make(chan struct{}, 1), make(chan struct{})
	hold := func(string) {
		started <- struct{}{}
		<-release
	}
	rd.d.hooks.readaheadAt.Store(&hold)
	node := nodeClient(t, sock)
	ctx := context.Background()
	attrs := map[string]string{AttrReference: testRef}
	publish := func(pod string) string {
		t.Helper()
		target := podTarget(t, dir, pod)
		if _, err := node.NodePublishVolume(ctx, testenv.PublishRequest(pod, target, attrs)); err != nil {
			t.Fatal(err)
		}
		return target
	}
	unpublish := func(target string) {
		t.Helper()
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target}); err != nil {
			t.Fatal(err)
		}
	}

	t1 := publish("p1")
	<-started // the readahead of p1's view holds before reading
	weights := filepath.Join(rd.d.state.Snapshot().Volumes[t1].Source, "model.safetensors")
	if err := os.WriteFile(weights, make([]byte, 8<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.EvictPages(t, weights)
	t2 := publish("p2") // the same view, whose readahead runs: none more (TestOneReadaheadPerDirectory)
	unpublish(t1)
	release <- struct{}{}
	rd.d.Wait()
	testenv.WaitResident(t, weights) // p2 still mounts the view: the readahead was not stopped

	testenv.EvictPages(t, weights)
	before := testutil.ToFloat64(rd.d.m.readaheadBytes)
	t3 := publish("p3")
	<-started
	unpublish(t2)
	unpublish(t3)
	close(release)
	rd.d.Wait()
	if n, total := testenv.ResidentPages(t, weights); n != 0 {
		t.Fatalf("%d of %d pages read after the view's last volume was unpublished", n, total)
	}
	if got := testutil.ToFloat64(rd.d.m.readaheadBytes) - before; got != 0 {
		t.Fatalf("readahead_bytes_total grew by %v for a readahead stopped before it read", got)
	}
}
