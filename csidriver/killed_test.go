package csidriver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/modelpack/modelpack/internal/testenv"
)

// A driver killed between recording a publish (PhaseMounting) and finishing it leaves a record, maybe a view hold
// and maybe a mount. The restarted driver undoes all of it, and kubelet's retry of the publish then mounts the
// model as if nothing had happened.
func TestPublishKilledHalfWayIsUndoneAndRetried(t *testing.T) {
	testenv.RequireRoot(t)
	for _, step := range []string{"staged", "acquired", "mounted"} {
		t.Run(step, func(t *testing.T) {
			dir := t.TempDir()
			cleanupMounts(t, dir)
			b := newFakeBackend(filepath.Join(dir, "cache"))
			b.push(testRef, "v1")
			target := podTarget(t, dir, "p")
			attrs := map[string]string{AttrReference: testRef}

			first, sock := startDriverAt(t, dir, b)
			kill := func(s string) bool { return s == step }
			first.d.hooks.killedAt.Store(&kill)
			if _, err := nodeClient(t, sock).NodePublishVolume(context.Background(), testenv.PublishRequest("v", target, attrs)); err == nil {
				t.Fatal("the killed publish succeeded")
			}
			first.stop()
			st := first.d.state.Snapshot()
			if v, ok := st.Volumes[target]; !ok || v.Phase != "mounting" {
				t.Fatalf("after the kill the record is %+v (present %v), want phase mounting", v, ok)
			}
			if step != "staged" && b.Stats().Refs != 1 {
				t.Fatalf("killed after acquiring: %d view holds, want 1", b.Stats().Refs)
			}
			if step == "mounted" && !isMounted(t, target) {
				t.Fatal("killed after mounting: the target is not mounted")
			}

			d, sock := startDriverAt(t, dir, b)
			if _, ok := d.d.state.Snapshot().Volumes[target]; ok {
				t.Fatal("the half-published record survived the restart")
			}
			if n := b.Stats().Refs; n != 0 {
				t.Fatalf("%d view holds after the restart, want 0", n)
			}
			if isMounted(t, target) {
				t.Fatal("the half-published target is still mounted")
			}
			if _, err := nodeClient(t, sock).NodePublishVolume(context.Background(), testenv.PublishRequest("v", target, attrs)); err != nil {
				t.Fatalf("kubelet's retry: %v", err)
			}
			if b, err := os.ReadFile(filepath.Join(target, "model.safetensors")); err != nil || len(b) == 0 {
				t.Fatalf("the retried volume is unreadable: %v", err)
			}
			if v := d.d.state.Snapshot().Volumes[target]; v.Phase != "published" || b.Stats().Refs != 1 {
				t.Fatalf("after the retry: phase %q, %d holds", v.Phase, b.Stats().Refs)
			}
			if _, err := nodeClient(t, sock).NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
