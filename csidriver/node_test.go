package csidriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"

	"github.com/modelpack/modelpack/internal/testenv"
)

const testRef = "registry.example.com/models/tiny:v1"

func nodeClient(t *testing.T, sock string) csi.NodeClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return csi.NewNodeClient(conn)
}

// podTarget makes the directory kubelet creates for a pod's volume and returns the target path inside it.
func podTarget(t *testing.T, dir, pod string) string {
	t.Helper()
	parent := filepath.Join(dir, "pods", pod, "volumes", "kubernetes.io~csi", "model")
	if err := os.MkdirAll(parent, 0o750); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(parent, "mount")
}

func wantCode(t *testing.T, err error, code codes.Code, contains string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v, want code %v", err, code)
	}
	if contains != "" && !strings.Contains(status.Convert(err).Message(), contains) {
		t.Fatalf("message %q does not contain %q", status.Convert(err).Message(), contains)
	}
}

func isMounted(t *testing.T, p string) bool {
	t.Helper()
	mnt, err := mount.New("").IsMountPoint(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return mnt
}

func TestPublishUnpublishAndCodes(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	b.push(testRef, "v1")
	_, sock := startDriver(t, dir, b)
	node := nodeClient(t, sock)
	ctx := context.Background()
	target := podTarget(t, dir, "p1")
	attrs := map[string]string{AttrReference: testRef, "csi.storage.k8s.io/pod.name": "p1", "csi.storage.k8s.io/ephemeral": "true"}

	if _, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v", target, attrs)); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(target, "model.safetensors")); err != nil || string(got) != testRef {
		t.Fatalf("model file: %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write into the volume: %v, want EROFS", err)
	}
	// A retry with the same arguments succeeds; other arguments on the same target conflict.
	if _, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v", target, attrs)); err != nil {
		t.Fatalf("idempotent republish: %v", err)
	}
	other := map[string]string{AttrReference: testRef, AttrFilter: "config"}
	_, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v", target, other))
	wantCode(t, err, codes.AlreadyExists, "other arguments")

	sub := podTarget(t, dir, "p-sub")
	if _, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v2", sub, map[string]string{AttrReference: testRef, AttrSubPath: "sub", AttrNoExec: "true"})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(sub, "config.json")); err != nil {
		t.Fatalf("subPath: %v", err)
	}
	for _, tgt := range []string{target, sub} {
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: tgt}); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(tgt); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("target %s not removed: %v", tgt, err)
		}
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target}); err != nil {
		t.Fatalf("unpublish of an unknown target: %v", err)
	}
	if n := b.Stats().Refs; n != 0 {
		t.Fatalf("%d views still held after unpublish", n)
	}

	t2 := podTarget(t, dir, "p2")
	for _, tc := range []struct {
		name  string
		attrs map[string]string
		code  codes.Code
		msg   string
	}{
		{"unknown attribute", map[string]string{AttrReference: testRef, "colour": "red"}, codes.InvalidArgument, "valid keys"},
		{"no reference", map[string]string{AttrPullPolicy: "Always"}, codes.InvalidArgument, "required"},
		{"bad reference", map[string]string{AttrReference: "Not A Reference"}, codes.InvalidArgument, "reference"},
		{"bad policy", map[string]string{AttrReference: testRef, AttrPullPolicy: "Sometimes"}, codes.InvalidArgument, "Always, IfNotPresent, Never"},
		{"bad filter", map[string]string{AttrReference: testRef, AttrFilter: "weights,pictures"}, codes.InvalidArgument, "pictures"},
		{"escaping subPath", map[string]string{AttrReference: testRef, AttrSubPath: "../.."}, codes.InvalidArgument, "leaves the model"},
		{"missing subPath", map[string]string{AttrReference: testRef, AttrSubPath: "nope"}, codes.InvalidArgument, "not found"},
		{"never and absent", map[string]string{AttrReference: "registry.example.com/models/other:v1", AttrPullPolicy: "Never"}, codes.FailedPrecondition, "Never"},
		{"manifest missing", map[string]string{AttrReference: "registry.example.com/models/other:v1"}, codes.NotFound, ""},
	} {
		_, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v", t2, tc.attrs))
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: got %v, want %v containing %q", tc.name, err, tc.code, tc.msg)
		}
		if _, err := os.Stat(t2); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: failed publish left the target behind", tc.name)
		}
	}
	_, err = node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "v", TargetPath: t2, VolumeContext: attrs})
	wantCode(t, err, codes.InvalidArgument, "capability")
	req := testenv.PublishRequest("v", t2, attrs)
	req.Secrets = map[string]string{"token": "s3cret"}
	_, err = node.NodePublishVolume(ctx, req)
	wantCode(t, err, codes.Unauthenticated, ".dockerconfigjson")
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatal("secret value leaked into the error")
	}

	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{ErrNoSpace, codes.ResourceExhausted},
		{ErrUnauthorized, codes.Unauthenticated},
		{ErrForbidden, codes.PermissionDenied},
		{ErrUnavailable, codes.Unavailable},
		{ErrDenied, codes.PermissionDenied},
	} {
		b.mu.Lock()
		b.pullErr = tc.err
		b.mu.Unlock()
		ref := "registry.example.com/models/failing:" + strings.ReplaceAll(tc.code.String(), " ", "")
		b.push(ref, tc.code.String())
		_, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v", t2, map[string]string{AttrReference: ref}))
		wantCode(t, err, tc.code, "")
	}
}

func TestAbortedPullIsJoinedByRetry(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	b.push(testRef, "v1")
	b.gate = make(chan struct{})
	_, sock := startDriver(t, dir, b)
	node := nodeClient(t, sock)
	target := podTarget(t, dir, "p1")
	attrs := map[string]string{AttrReference: testRef}

	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		start := time.Now()
		_, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v", target, attrs))
		cancel()
		wantCode(t, err, codes.Aborted, "in progress")
		if el := time.Since(start); el > time.Second {
			t.Fatalf("ABORTED came after the deadline (%v)", el)
		}
	}
	close(b.gate)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v", target, attrs)); err != nil {
		t.Fatal(err)
	}
	if n := b.pulls.Load(); n != 1 {
		t.Fatalf("%d pulls, want 1: retries must join the pull under way", n)
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target}); err != nil {
		t.Fatal(err)
	}
}

func TestSlowRegistryAnswersAbortedInTime(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	b.push(testRef, "v1")
	b.resolveGate = make(chan struct{})
	_, sock := startDriver(t, dir, b)
	node := nodeClient(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v", podTarget(t, dir, "p"), map[string]string{AttrReference: testRef}))
	wantCode(t, err, codes.Aborted, "resolving")
	close(b.resolveGate)
}

func TestRestartRecovery(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	b.push(testRef, "v1")
	attrs := map[string]string{AttrReference: testRef}
	kept, lost, gone := podTarget(t, dir, "kept"), podTarget(t, dir, "lost"), podTarget(t, dir, "gone")

	first, sock := startDriverAt(t, dir, b)
	node := nodeClient(t, sock)
	for i, tgt := range []string{kept, lost, gone} {
		if _, err := node.NodePublishVolume(context.Background(), testenv.PublishRequest(fmt.Sprint("v", i), tgt, attrs)); err != nil {
			t.Fatal(err)
		}
	}
	first.stop()
	// While the driver is down: one mount is lost (a reboot), one pod vanishes entirely.
	if err := syscall.Unmount(lost, 0); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Unmount(gone, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "pods", "gone")); err != nil {
		t.Fatal(err)
	}
	// A hold on a view that no record accounts for (killed between acquiring and recording), and one that is
	// not the driver's (a pin), which must stay.
	b.mu.Lock()
	b.owners[OwnerPrefix+"orphan"] = "somewhere"
	b.owners["pin:keep"] = "somewhere"
	b.mu.Unlock()

	d, sock := startDriverAt(t, dir, b)
	defer d.stop()
	if !isMounted(t, kept) || !isMounted(t, lost) {
		t.Fatalf("after restart: kept mounted=%v, lost remounted=%v", isMounted(t, kept), isMounted(t, lost))
	}
	if _, err := os.ReadFile(filepath.Join(lost, "model.safetensors")); err != nil {
		t.Fatalf("repaired volume unreadable: %v", err)
	}
	st := d.d.state.Snapshot()
	if _, ok := st.Volumes[gone]; ok {
		t.Fatal("volume of a vanished pod was not collected")
	}
	if n := b.Stats().Refs; n != 3 {
		t.Fatalf("%d views held, want the 2 volumes' and the pin's", n)
	}
	if _, ok := b.owners["pin:keep"]; !ok {
		t.Fatal("a hold that is not the driver's was released")
	}
	node = nodeClient(t, sock)
	for _, tgt := range []string{kept, lost} {
		if _, err := node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "x", TargetPath: tgt}); err != nil {
			t.Fatal(err)
		}
		if isMounted(t, tgt) {
			t.Fatalf("%s still mounted", tgt)
		}
	}
}

type runningDriver struct {
	d    *Driver
	stop func()
}

// startDriverAt runs a driver on dir's socket and state that the caller stops (to restart it on the same state).
func startDriverAt(t *testing.T, dir string, b Backend) (runningDriver, string) {
	t.Helper()
	return startDriverWith(t, dir, b, func(*Options) {})
}

// startDriverWith is startDriverAt with options changed by set.
func startDriverWith(t *testing.T, dir string, b Backend, set func(*Options)) (runningDriver, string) {
	t.Helper()
	sock := filepath.Join(dir, "csi.sock")
	opts := Options{NodeID: "n", Endpoint: "unix://" + sock, StateDir: filepath.Join(dir, "state"), OwnDirs: []string{filepath.Join(dir, "cache")}, Backend: b,
		Logger: discardLogger()}
	set(&opts)
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(sock)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	waitSocket(t, sock)
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return runningDriver{d: d, stop: stop}, sock
}

func TestWaitBudget(t *testing.T) {
	for _, tc := range []struct{ left, want time.Duration }{
		{2 * time.Minute, 2*time.Minute - 5*time.Second},
		{10 * time.Second, 7500 * time.Millisecond},
		{2 * time.Second, time.Second},
		{800 * time.Millisecond, 400 * time.Millisecond},
		{0, 0},
		{-time.Second, 0},
	} {
		if got := waitBudget(tc.left); got != tc.want {
			t.Errorf("waitBudget(%v) = %v, want %v", tc.left, got, tc.want)
		}
	}
}

func TestVolumesOfVanishedPodsAreCollectedWhileRunning(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	b.push(testRef, "v1")
	sock := filepath.Join(dir, "csi.sock")
	d, err := New(Options{NodeID: "n", Endpoint: "unix://" + sock, StateDir: filepath.Join(dir, "state"), OwnDirs: []string{filepath.Join(dir, "cache")}, Backend: b,
		Logger: discardLogger(), GCInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitSocket(t, sock)
	node := nodeClient(t, sock)
	target := podTarget(t, dir, "p")
	if _, err := node.NodePublishVolume(context.Background(), testenv.PublishRequest("v", target, map[string]string{AttrReference: testRef})); err != nil {
		t.Fatal(err)
	}
	// kubelet force-cleaned the pod without unpublishing (its mount is gone with the pod directory). The pod
	// directory leaves its path in one rename first: unmounting in place would let the GC, which repairs a
	// published target that lost its mount, mount it again between the unmount and the removal.
	gone := filepath.Join(dir, "gone")
	if err := os.Rename(filepath.Join(dir, "pods", "p"), gone); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Unmount(filepath.Join(gone, strings.TrimPrefix(target, filepath.Join(dir, "pods", "p"))), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(gone); err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); len(d.state.Snapshot().Volumes) != 0; time.Sleep(20 * time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatal("volume of a vanished pod not collected")
		}
	}
	if n := b.Stats().Refs; n != 0 {
		t.Fatalf("%d view holds left", n)
	}
}

func TestTargetLockAbortsCallsButWaitsForTheReconciler(t *testing.T) {
	d := &Driver{targets: map[string]*targetHold{}}
	ctx := context.Background()
	if !d.lockTarget(ctx, "/t") {
		t.Fatal("free target not granted")
	}
	if d.lockTarget(ctx, "/t") || d.tryLockTarget("/t") {
		t.Fatal("a held target was granted again")
	}
	d.unlockTarget("/t")
	if !d.tryLockTarget("/t") {
		t.Fatal("reconciler not granted a free target")
	}
	got := make(chan bool)
	go func() { got <- d.lockTarget(ctx, "/t") }()
	select {
	case <-got:
		t.Fatal("a call did not wait for the reconciler")
	case <-time.After(50 * time.Millisecond):
	}
	d.unlockTarget("/t")
	if !<-got {
		t.Fatal("the waiting call was not granted the target")
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	d.unlockTarget("/t")
	d.tryLockTarget("/t")
	if d.lockTarget(short, "/t") {
		t.Fatal("granted past the caller's deadline")
	}
}
