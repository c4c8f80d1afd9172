package csidriver

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	digest "github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Content already on the node is verified on every publish, whatever the pull policy: a policy that starts to
// refuse a digest after it was pulled stops new mounts of it, and a refused publish leaves nothing mounted.
func TestPolicyAppliesToContentAlreadyOnTheNode(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	d := b.push(testRef, "v1")
	_, sock := startDriver(t, dir, b)
	node := nodeClient(t, sock)
	ctx := context.Background()

	first := podTarget(t, dir, "p1")
	if _, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v1", first, map[string]string{AttrReference: testRef})); err != nil {
		t.Fatal(err)
	}
	pulls := b.pulls.Load()

	b.mu.Lock()
	b.deny = map[digest.Digest]bool{d: true}
	b.mu.Unlock()
	for _, policy := range []PullPolicy{PullIfNotPresent, PullNever, PullAlways} {
		target := podTarget(t, dir, "p-"+string(policy))
		_, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v-"+string(policy), target, map[string]string{AttrReference: testRef, AttrPullPolicy: string(policy)}))
		wantCode(t, err, codes.PermissionDenied, "not signed")
		if isMounted(t, target) {
			t.Fatalf("%s: refused volume is mounted", policy)
		}
	}
	if got := b.pulls.Load(); got != pulls {
		t.Fatalf("refused publishes pulled %d times", got-pulls)
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v1", TargetPath: first}); err != nil {
		t.Fatal(err)
	}
}

// A publish of a target published before, whose mount has gone, mounts again: the policy applies to that mount too.
func TestPolicyAppliesToRepublishThatRemounts(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	d := b.push(testRef, "v1")
	_, sock := startDriver(t, dir, b)
	node := nodeClient(t, sock)
	ctx := context.Background()

	target := podTarget(t, dir, "p1")
	req := testenv.PublishRequest("v1", target, map[string]string{AttrReference: testRef})
	if _, err := node.NodePublishVolume(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	b.deny = map[digest.Digest]bool{d: true}
	b.mu.Unlock()
	_, err := node.NodePublishVolume(ctx, req)
	wantCode(t, err, codes.PermissionDenied, "not signed")
	if isMounted(t, target) {
		t.Fatal("refused content was mounted again")
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v1", TargetPath: target}); err != nil {
		t.Fatal(err)
	}
}
