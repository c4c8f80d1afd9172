package csidriver

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

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

// An attacker who can place a symbolic link where kubelet would put a target (or name a target the driver never
// published) must not get the driver to unmount, delete or mount over anything of someone else's: unpublish acts
// only on a view of this driver mounted on the target itself, publish refuses a link, and no target may lie in the
// driver's own directories. Real mounts throughout.
func TestUnpublishActsOnlyOnWhatTheDriverPublished(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	ref := "registry.example/m:v1"
	b.push(ref, "weights")
	_, sock := startDriver(t, dir, b)
	node := nodeClient(t, sock)
	ctx := context.Background()

	// Someone else's mount: a tmpfs with a file in it.
	other := filepath.Join(dir, "other-mount")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", other, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(other, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(other, "data"), []byte("not ours"), 0o644); err != nil {
		t.Fatal(err)
	}
	stillMounted := func() {
		t.Helper()
		if b, err := os.ReadFile(filepath.Join(other, "data")); err != nil || string(b) != "not ours" {
			t.Fatalf("the other mount was touched: %q %v", b, err)
		}
	}

	t.Run("unpublish of a never-published target that links to another mount", func(t *testing.T) {
		link := podTarget(t, dir, "link")
		if err := os.Symlink(other, link); err != nil {
			t.Fatal(err)
		}
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: link}); err != nil {
			t.Fatalf("unpublish: %v", err)
		}
		stillMounted()
		if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Fatalf("the link was deleted or replaced: %v", err)
		}
	})
	t.Run("unpublish of a never-published target with a foreign mount on it", func(t *testing.T) {
		target := podTarget(t, dir, "foreign")
		if err := os.Mkdir(target, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(other, target, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(target, unix.MNT_DETACH) })
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target}); err != nil {
			t.Fatalf("unpublish: %v", err)
		}
		if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "not ours" {
			t.Fatalf("the foreign mount on the target was taken off: %q %v", b, err)
		}
	})
	t.Run("publish on a link is refused and mounts nothing behind it", func(t *testing.T) {
		link := podTarget(t, dir, "publink")
		if err := os.Symlink(other, link); err != nil {
			t.Fatal(err)
		}
		_, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v", link, map[string]string{"reference": ref}))
		wantCode(t, err, codes.InvalidArgument, "symbolic link")
		if _, err := os.Stat(filepath.Join(other, "model.safetensors")); err == nil {
			t.Fatal("the model was mounted behind the link")
		}
		stillMounted()
	})
	t.Run("a target whose parent is a link is refused: nothing is created or mounted behind it", func(t *testing.T) {
		// The pod's volume directory swapped for a link to a directory elsewhere (a root-only one here).
		behind := filepath.Join(dir, "root-only")
		if err := os.Mkdir(behind, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, depth := range []string{"parent", "grandparent"} {
			target := podTarget(t, dir, "linked-"+depth)
			swap := filepath.Dir(target)
			if depth == "grandparent" {
				swap = filepath.Dir(swap)
			}
			if err := os.RemoveAll(swap); err != nil {
				t.Fatal(err)
			}
			dest := filepath.Join(behind, depth)
			if err := os.MkdirAll(filepath.Join(dest, "model"), 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(dest, swap); err != nil {
				t.Fatal(err)
			}
			_, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v", target, map[string]string{"reference": ref}))
			wantCode(t, err, codes.InvalidArgument, "target_path")
			wantCode(t, err, codes.InvalidArgument, swap+" is a symbolic link")
			filepath.WalkDir(dest, func(p string, de fs.DirEntry, err error) error {
				if err == nil && (de.Name() == "mount" || de.Name() == "model.safetensors") {
					t.Errorf("%s created behind the link", p)
				}
				return nil
			})
			// Unpublish through it acts on nothing there either.
			_, err = node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target})
			wantCode(t, err, codes.InvalidArgument, "symbolic link")
		}
		testenv.NoMountsLeftUnder(t, behind)
	})
	t.Run("targets in the driver's own directories are refused", func(t *testing.T) {
		via := filepath.Join(dir, "pods", "via")
		os.MkdirAll(filepath.Dir(via), 0o750)
		os.MkdirAll(filepath.Join(dir, "cache"), 0o750) // as the cache's root always is
		if err := os.Symlink(filepath.Join(dir, "cache"), via); err != nil {
			t.Fatal(err)
		}
		for _, target := range []string{filepath.Join(dir, "cache", "x"), filepath.Join(dir, "state"), filepath.Join(via, "x"), dir} {
			_, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v", target, map[string]string{"reference": ref}))
			wantCode(t, err, codes.InvalidArgument, "own directory")
			_, err = node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target})
			wantCode(t, err, codes.InvalidArgument, "own directory")
		}
	})
	t.Run("state lost: a view of the driver's on an unknown target is still taken off", func(t *testing.T) {
		target := podTarget(t, dir, "ours")
		if _, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v-ours", target, map[string]string{"reference": ref})); err != nil {
			t.Fatal(err)
		}
		// A second mount of the same view, unknown to the state, as after a lost state.
		src := filepath.Join(dir, "pods", "lost", "mount")
		if err := os.MkdirAll(src, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(target, src, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: src}); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(src); !os.IsNotExist(err) {
			t.Fatalf("the driver's own view left on the unknown target: %v", err)
		}
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v-ours", TargetPath: target}); err != nil {
			t.Fatal(err)
		}
	})
}
