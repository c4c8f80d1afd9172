package csidriver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/modelpack/modelpack/internal/testenv"
)

// After the persisted state is lost (unreadable at start), the driver cannot tell a live pod's view hold from an
// orphan, so it keeps every hold: the mounted volume keeps its view until kubelet unpublishes it, and that
// unpublish — of a target the driver no longer knows — releases it.
func TestLostStateKeepsViewHoldsUntilUnpublish(t *testing.T) {
	testenv.RequireRoot(t)
	// state.db unreadable loses the state, and so does a document of an earlier release that does not parse when
	// it is imported: volumes.json held the volume records, and state.json held them before volumes.json existed.
	for _, doc := range []string{"state.db", "state.json", "volumes.json"} {
		t.Run(doc, func(t *testing.T) { testLostState(t, doc) })
	}
}

func testLostState(t *testing.T, doc string) {
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	b.push(testRef, "v1")
	target := podTarget(t, dir, "live")

	first, sock := startDriverAt(t, dir, b)
	if _, err := nodeClient(t, sock).NodePublishVolume(context.Background(), testenv.PublishRequest("v", target, map[string]string{AttrReference: testRef})); err != nil {
		t.Fatal(err)
	}
	first.stop()
	if err := os.WriteFile(filepath.Join(dir, "state", doc), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}

	d, sock := startDriverAt(t, dir, b)
	defer d.stop()
	d.d.releaseOrphanViews() // what the periodic reconciler runs
	if n := b.Stats().Refs; n != 1 {
		t.Fatalf("%d view holds after a lost state, want the live volume's 1", n)
	}
	if !isMounted(t, target) {
		t.Fatal("the live volume was unmounted")
	}
	if _, err := nodeClient(t, sock).NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if n := b.Stats().Refs; n != 0 || isMounted(t, target) {
		t.Fatalf("after unpublish: %d holds, mounted=%v", n, isMounted(t, target))
	}
}
