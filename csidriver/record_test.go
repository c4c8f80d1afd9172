package csidriver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	digest "github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"

	"github.com/modelpack/modelpack/internal/testenv"
)

// TestRecordImage: content put in the cache beside the driver (a prepull) and recorded under any spelling of its
// tag is present for IfNotPresent and Never, across a restart, with the registry no longer knowing the tag;
// Always still asks the registry.
func TestRecordImage(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	const mounted = "docker.io/library/tiny:latest"
	dgst := b.push(mounted, "v1")
	if _, err := b.Pull(context.Background(), "prepulled", dgst, "", Credentials{}, func(Progress) {}); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	delete(b.tags, mounted) // the registry is gone: any resolve fails
	b.mu.Unlock()
	drv, sock := startDriverAt(t, dir, b)
	node := nodeClient(t, sock)
	ctx := context.Background()
	attrs := func(policy PullPolicy) map[string]string {
		return map[string]string{AttrReference: mounted, AttrPullPolicy: string(policy)}
	}

	target := podTarget(t, dir, "before")
	_, err := node.NodePublishVolume(ctx, testenv.PublishRequest("v", target, attrs(PullIfNotPresent)))
	wantCode(t, err, codes.NotFound, "")

	for _, bad := range []struct {
		ref, platform string
		manifest      digest.Digest
	}{
		{"Not A Reference", "", dgst},
		{"tiny", "linux", dgst},
		{"tiny", "", "sha256:nothex"},
	} {
		if err := drv.d.RecordImage(bad.ref, bad.platform, dgst, bad.manifest); err == nil {
			t.Errorf("RecordImage(%q, %q, …, %q) accepted", bad.ref, bad.platform, bad.manifest)
		}
	}
	if err := drv.d.RecordImage("tiny", "", dgst, dgst); err != nil {
		t.Fatal(err)
	}

	publish := func(pod string, policy PullPolicy) {
		t.Helper()
		target := podTarget(t, dir, pod)
		if _, err := node.NodePublishVolume(ctx, testenv.PublishRequest(pod, target, attrs(policy))); err != nil {
			t.Fatalf("%s publish of a recorded image: %v", policy, err)
		}
		if got, err := os.ReadFile(filepath.Join(target, "model.safetensors")); err != nil || string(got) != "prepulled" {
			t.Fatalf("model file: %q, %v", got, err)
		}
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: pod, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
	}
	publish("ifnotpresent", PullIfNotPresent)
	publish("never", PullNever)
	_, err = node.NodePublishVolume(ctx, testenv.PublishRequest("always", podTarget(t, dir, "always"), attrs(PullAlways)))
	wantCode(t, err, codes.NotFound, "")

	drv.stop()
	_, sock = startDriverAt(t, dir, b)
	node = nodeClient(t, sock)
	publish("restarted", PullIfNotPresent)
}
