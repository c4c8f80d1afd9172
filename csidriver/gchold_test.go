package csidriver_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/modelpack/modelpack/cache"
	"github.com/modelpack/modelpack/csidriver"
	"github.com/modelpack/modelpack/csidriver/cachebackend"
	"github.com/modelpack/modelpack/internal/testenv"
)

// A publish holds what it found until its view is acquired, under any GC setting: with a cap below one model and
// no minimum age, GC runs at the worst moment, while the publish is verifying the model (between finding it and
// mounting it), for content already on the node and for content the publish has just pulled. Every publish
// mounts; GC evicts the model once nothing holds it.
// (The verifier runs after the model was found: before a pull for new content, so the pull's own window, from its
// end to the hold, is covered by the cache's tests and the driver's repull.)
func TestGCNeverEvictsWhatAPublishIsAboutToMount(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	csidriver.CleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	src := filepath.Join(dir, "src")
	os.MkdirAll(src, 0o755)
	writeFiles(t, src, map[string]string{"model.safetensors": "weights that do not fit under the cap"})
	ref := reg.Host + "/models/held:v1"
	orasPush(t, src, "--artifact-type", "application/vnd.cncf.model.manifest.v1+json", ref, "model.safetensors:application/vnd.cncf.model.weight.v1.raw")

	var c *cache.Cache
	evicted := 0
	// The verifier runs on every publish after the model was found or pulled and before its view is acquired:
	// GC runs there, to completion.
	gc := cachebackend.VerifierFunc(func(ctx context.Context, _ string) error {
		st, err := c.GC(ctx)
		evicted += len(st.Evicted)
		return err
	})
	sock, cc := startCacheDriverWith(t, filepath.Join(dir, "node"), cache.Options{MaxBytes: 1, MinAge: -1}, gc, reg.Host)
	c = cc
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	node := csi.NewNodeClient(conn)
	for i, policy := range []string{"IfNotPresent", "IfNotPresent", "Always", "Never", "IfNotPresent"} {
		parent := filepath.Join(dir, "pods", policy+string(rune('a'+i)))
		os.MkdirAll(parent, 0o755)
		target := filepath.Join(parent, "mount")
		req := testenv.PublishRequest("v", target, map[string]string{"reference": ref, "pullPolicy": policy})
		if _, err := node.NodePublishVolume(context.Background(), req); err != nil {
			t.Fatalf("publish %d (%s) with GC racing it: %v", i, policy, err)
		}
		if b, err := os.ReadFile(filepath.Join(target, "model.safetensors")); err != nil || string(b) != "weights that do not fit under the cap" {
			t.Fatalf("publish %d mounted %q, %v", i, b, err)
		}
		if _, err := node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target}); err != nil {
			t.Fatal(err)
		}
	}
	if evicted != 0 {
		t.Fatalf("GC evicted %d manifests while publishes held them", evicted)
	}
	// Unreferenced and unheld, the model goes at the next collection.
	if _, err := c.GC(context.Background()); err != nil {
		t.Fatal(err)
	}
	if list, _ := c.List(); len(list) != 0 {
		t.Fatalf("after the last unpublish GC kept %d manifests, want none (nothing holds them)", len(list))
	}
}
