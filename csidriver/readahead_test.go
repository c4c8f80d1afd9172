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

// readaheadNode is a driver with readahead on, over the fake backend, publishing testRef for pods by name.
type readaheadNode struct {
	t    *testing.T
	dir  string
	rd   runningDriver
	node csi.NodeClient
}

func startReadaheadNode(t *testing.T) *readaheadNode {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	b.push(testRef, "v1")
	rd, sock := startDriverWith(t, dir, b, func(o *Options) { o.Readahead = readahead.Fixed(1 << 30) })
	return &readaheadNode{t: t, dir: dir, rd: rd, node: nodeClient(t, sock)}
}

func (n *readaheadNode) publish(pod string) string {
	n.t.Helper()
	target := podTarget(n.t, n.dir, pod)
	if _, err := n.node.NodePublishVolume(context.Background(), testenv.PublishRequest(pod, target, map[string]string{AttrReference: testRef})); err != nil {
		n.t.Fatal(err)
	}
	return target
}

func (n *readaheadNode) unpublish(target string) {
	n.t.Helper()
	if _, err := n.node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target}); err != nil {
		n.t.Fatal(err)
	}
}

// growWeights makes the view's weights a real size, on disk and out of the page cache, as on a node after a
// restart, and returns their path.
func (n *readaheadNode) growWeights(target string) string {
	n.t.Helper()
	weights := filepath.Join(n.rd.d.state.Snapshot().Volumes[target].Source, "model.safetensors")
	if err := os.WriteFile(weights, make([]byte, 24<<20), 0o644); err != nil {
		n.t.Fatal(err)
	}
	testenv.EvictPages(n.t, weights)
	return weights
}

func (n *readaheadNode) readBytes() float64 { return testutil.ToFloat64(n.rd.d.m.readaheadBytes) }

// A publish of a model the node holds on disk, but not in memory, has its files read into the page cache before
// the pod reads them.
func TestPublishReadsTheVolumeAhead(t *testing.T) {
	n := startReadaheadNode(t)
	t1 := n.publish("p1")
	n.rd.d.Wait()
	weights := n.growWeights(t1)
	before := n.readBytes()

	drops := testenv.PageCacheDrops(t)
	t2 := n.publish("p2")
	n.rd.d.Wait()
	testenv.WaitResident(t, filepath.Join(t2, "model.safetensors"), drops, func() {
		n.rd.d.ahead.Start(filepath.Dir(weights))
		n.rd.d.Wait()
	})
	if got := n.readBytes() - before; got < 24<<20 {
		t.Fatalf("readahead_bytes_total grew by %v, want the 24 MiB of %s and more", got, weights)
	}
	n.unpublish(t1)
	n.unpublish(t2)
}

// The readahead of a view goes on while a volume still mounts it, and stops when the last one is unpublished.
func TestReadaheadStopsWithTheViewsLastVolume(t *testing.T) {
	n := startReadaheadNode(t)
	started, release := make(chan struct{}, 1), make(chan struct{})
	hold := func(string) {
		started <- struct{}{}
		<-release
	}
	n.rd.d.hooks.readaheadAt.Store(&hold)

	t1 := n.publish("p1")
	<-started // the readahead of p1's view holds before reading
	weights := n.growWeights(t1)
	before := n.readBytes()
	t2 := n.publish("p2") // the same view, whose readahead runs: none more (TestOneReadaheadPerDirectory)
	n.unpublish(t1)
	release <- struct{}{}
	n.rd.d.Wait()
	// p2 still mounts the view: the readahead was not stopped (stopped at the gate, it would count nothing).
	if got := n.readBytes() - before; got < 24<<20 {
		t.Fatalf("readahead_bytes_total grew by %v, want the 24 MiB of %s and more", got, weights)
	}

	testenv.EvictPages(t, weights)
	before = n.readBytes()
	t3 := n.publish("p3")
	<-started
	n.unpublish(t2)
	n.unpublish(t3)
	close(release)
	n.rd.d.Wait()
	if got, total := testenv.ResidentPages(t, weights); got != 0 {
		t.Fatalf("%d of %d pages read after the view's last volume was unpublished", got, total)
	}
	if got := n.readBytes() - before; got != 0 {
		t.Fatalf("readahead_bytes_total grew by %v for a readahead stopped before it read", got)
	}
}
