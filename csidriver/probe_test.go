package csidriver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/modelpack/modelpack/internal/testenv"
)

// A state file the driver cannot write (made immutable with the kernel's FS_IMMUTABLE_FL, as chattr +i does, or on
// a file system remounted read-only) makes every publish fail: Probe says not ready with the cause instead of
// ready, and is ready again once the state can be written.
func TestProbeNotReadyWhileStateCannotBeWritten(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	b.push("registry.example/m:v1", "weights")
	d, sock := startDriver(t, dir, b)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ids := csi.NewIdentityClient(conn)
	node := nodeClient(t, sock)
	probe := func() error {
		resp, err := ids.Probe(context.Background(), &csi.ProbeRequest{})
		if err == nil && !resp.GetReady().GetValue() {
			t.Fatal("not ready without a cause")
		}
		return err
	}
	if err := probe(); err != nil {
		t.Fatalf("probe of a healthy driver: %v", err)
	}
	// A publish writes the state first.
	if _, err := node.NodePublishVolume(context.Background(), testenv.PublishRequest("v", podTarget(t, dir, "a"), map[string]string{"reference": "registry.example/m:v1"})); err != nil {
		t.Fatal(err)
	}
	state := d.state.Path()

	t.Run("immutable state file", func(t *testing.T) {
		// As chattr does: the other flags are kept (on ext4, clearing the extents flag of a file whose blocks are
		// not allocated yet fails with EOPNOTSUPP).
		const fsImmutableFL = 0x10 // FS_IMMUTABLE_FL (linux/fs.h)
		immutable := func(on bool) {
			f, err := os.Open(state)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			flags, err := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS)
			if err != nil {
				t.Fatal(err)
			}
			flags &^= fsImmutableFL
			if on {
				flags |= fsImmutableFL
			}
			if err := unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, flags); err != nil {
				t.Fatal(err)
			}
		}
		immutable(true)
		t.Cleanup(func() { immutable(false) })
		wantCode(t, probe(), codes.FailedPrecondition, "cannot be written")
		immutable(false)
		if err := probe(); err != nil {
			t.Fatalf("still not ready once writable: %v", err)
		}
	})
	t.Run("read-only file system", func(t *testing.T) {
		sdir := filepath.Dir(state)
		if err := unix.Mount(sdir, sdir, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(sdir, unix.MNT_DETACH) })
		if err := unix.Mount("", sdir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			t.Fatal(err)
		}
		wantCode(t, probe(), codes.FailedPrecondition, "read-only file system")
		if err := unix.Unmount(sdir, 0); err != nil {
			t.Fatal(err)
		}
		if err := probe(); err != nil {
			t.Fatalf("still not ready once writable: %v", err)
		}
	})
	if _, err := node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: podTarget(t, dir, "a")}); err != nil {
		t.Fatal(err)
	}
}

// Metrics never listen on every interface by default: on the pod's address when POD_IP is set, else loopback.
func TestDefaultMetricsAddrIsNotEveryInterface(t *testing.T) {
	t.Setenv("POD_IP", "")
	if got := DefaultMetricsAddr("9808"); got != "127.0.0.1:9808" {
		t.Errorf("without POD_IP: %s", got)
	}
	t.Setenv("POD_IP", "fd00::7")
	if got := DefaultMetricsAddr("9808"); got != "[fd00::7]:9808" {
		t.Errorf("with an IPv6 POD_IP: %s", got)
	}
}
