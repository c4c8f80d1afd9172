package csidriver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Unpublishing a target this driver never published is OK (CSI idempotency): an empty directory is removed, a
// directory with someone else's content is left alone.
func TestUnpublishUnknownTargetIsOKAndKeepsForeignContent(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	_, sock := startDriver(t, dir, b)
	node := nodeClient(t, sock)
	ctx := context.Background()

	empty := podTarget(t, dir, "empty")
	if err := os.Mkdir(empty, 0o750); err != nil {
		t.Fatal(err)
	}
	full := podTarget(t, dir, "full")
	if err := os.MkdirAll(full, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(full, "data"), []byte("not ours"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{empty, full, filepath.Join(dir, "never-existed")} {
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target}); err != nil {
			t.Fatalf("unpublish of unknown %s: %v", target, err)
		}
	}
	if _, err := os.Stat(empty); !os.IsNotExist(err) {
		t.Fatalf("empty unknown target not removed: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(full, "data")); err != nil || string(b) != "not ours" {
		t.Fatalf("foreign content touched: %q %v", b, err)
	}
}
