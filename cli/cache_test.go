package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/cache"
)

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func TestCacheCommands(t *testing.T) {
	ctx := context.Background()
	driverRoot := t.TempDir()
	dir := filepath.Join(driverRoot, "cache") // where csi-driver --root=driverRoot keeps its cache
	store := memory.New()
	push := func(mt string, b []byte, ann map[string]string) ocispec.Descriptor {
		d := content.NewDescriptorFromBytes(mt, b)
		d.Annotations = ann
		if err := store.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	w := push(artifact.LayerMediaType(artifact.KindWeight, artifact.FormatRaw), []byte("weights"), map[string]string{artifact.AnnotationFilepath: "w.safetensors"})
	cfg := push(artifact.MediaTypeModelConfig, []byte(`{"descriptor":{},"config":{},"modelfs":{"type":"layers","diffIds":[]}}`), nil)
	m, err := oras.PackManifest(ctx, store, oras.PackManifestVersion1_1, artifact.ArtifactTypeModelManifest, oras.PackManifestOptions{ConfigDescriptor: &cfg, Layers: []ocispec.Descriptor{w}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.Open(cache.Options{Root: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pull(ctx, store, m, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire("vol-1", m.Digest, cache.Selector{}); err != nil {
		t.Fatal(err)
	}
	c.Close()

	out, err := runCLI(t, "cache", "ls", "--root", dir)
	if err != nil || !strings.Contains(out, m.Digest.Encoded()[:12]) || !strings.Contains(out, "vol-1") {
		t.Fatalf("ls: %v\n%s", err, out)
	}
	// The driver's --root is understood as its cache, <root>/cache, not opened as an empty cache.
	if out, err := runCLI(t, "cache", "ls", "--root", driverRoot); err != nil || !strings.Contains(out, m.Digest.Encoded()[:12]) {
		t.Fatalf("ls --root of the driver's root: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(driverRoot, "meta.db")); err == nil {
		t.Fatal("cache ls made the driver's root a cache")
	}
	out, err = runCLI(t, "cache", "ls", "--root", dir, "-o", "json")
	var entries []cache.Entry
	if err != nil || json.Unmarshal([]byte(out), &entries) != nil || len(entries) != 1 || entries[0].Descriptor.Digest != m.Digest {
		t.Fatalf("ls json: %v\n%s", err, out)
	}
	out, err = runCLI(t, "cache", "du", "--root", dir, "-o", "json")
	var u cache.Usage
	if err != nil || json.Unmarshal([]byte(out), &u) != nil || u.BlobCount != 3 || u.Refs != 1 {
		t.Fatalf("du: %v\n%s", err, out)
	}
	if out, err = runCLI(t, "cache", "verify", "--root", dir); err != nil || !strings.Contains(out, "verified 3 blobs") {
		t.Fatalf("verify: %v\n%s", err, out)
	}
	// A flipped byte: verify reports it; verify --repair quarantines it, so the manifest is pulled again.
	blob := filepath.Join(dir, "blobs", "sha256", w.Digest.Encoded())
	os.Chmod(blob, 0o644)
	if err := os.WriteFile(blob, []byte("weightz"), 0o444); err != nil {
		t.Fatal(err)
	}
	if out, err = runCLI(t, "cache", "verify", "--root", dir); err == nil || !strings.Contains(out, w.Digest.String()) {
		t.Fatalf("verify of a corrupt blob: %v\n%s", err, out)
	}
	if out, err = runCLI(t, "cache", "verify", "--root", dir, "--repair"); err == nil || !strings.Contains(out, "repaired: 1 blobs quarantined") {
		t.Fatalf("verify --repair: %v\n%s", err, out)
	}
	c, _ = cache.Open(cache.Options{Root: dir})
	if c.Has(m.Digest) {
		t.Fatal("manifest with a quarantined blob still complete")
	}
	if _, err := c.Pull(ctx, store, m, nil); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if out, err = runCLI(t, "cache", "verify", "--root", dir); err != nil {
		t.Fatalf("verify after repair and pull: %v\n%s", err, out)
	}
	if _, err = runCLI(t, "cache", "rm", "--root", dir, m.Digest.Encoded()[:8]); err == nil || !strings.Contains(err.Error(), "in use by vol-1") {
		t.Fatalf("rm of a referenced manifest: %v", err)
	}
	out, err = runCLI(t, "cache", "gc", "--root", dir, "--max-size", "1", "-o", "json")
	var st cache.GCStats
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || len(st.Evicted) != 0 {
		t.Fatalf("gc kept nothing referenced? %v\n%s", err, out)
	}

	// Release, then rm works and verify of an empty cache is clean.
	c, _ = cache.Open(cache.Options{Root: dir})
	c.Release("vol-1")
	c.Close()
	if out, err = runCLI(t, "cache", "rm", "--root", dir, m.Digest.String()); err != nil || !strings.Contains(out, "removed") {
		t.Fatalf("rm: %v\n%s", err, out)
	}
	if out, err = runCLI(t, "cache", "ls", "--root", dir, "-o", "json"); err != nil || strings.TrimSpace(out) != "[]" {
		t.Fatalf("ls after rm: %v\n%s", err, out)
	}
	if _, err = runCLI(t, "cache", "ls", "--root", dir+"/missing"); err == nil {
		t.Fatal("ls of a missing root succeeded")
	}
}
