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
	"github.com/modelpack/modelpack/internal/testenv"
)

// cache gc --high-watermark/--low-watermark on a real 4 MiB file system, through the real CLI: under the high
// watermark nothing is evicted, over it the model goes; bad pairs are usage errors naming the flag.
func TestCacheGCWatermarks(t *testing.T) {
	ctx := context.Background()
	disk := testenv.SmallDisk(t, "4m")
	dir := filepath.Join(disk, "cache")
	store := memory.New()
	push := func(mt string, b []byte, ann map[string]string) ocispec.Descriptor {
		d := content.NewDescriptorFromBytes(mt, b)
		d.Annotations = ann
		if err := store.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	w := push(artifact.LayerMediaType(artifact.KindWeight, artifact.FormatRaw), bytes.Repeat([]byte("w"), 1<<20), map[string]string{artifact.AnnotationFilepath: "w.safetensors"})
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
	c.Close()
	run := binaryRunner(t)
	gc := func(high, low string) cache.GCStats {
		t.Helper()
		code, out, errOut := run("cache", "gc", "--root", dir, "--high-watermark", high, "--low-watermark", low, "-o", "json")
		var st cache.GCStats
		if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
			t.Fatalf("cache gc %s/%s: exit %d %s %s", high, low, code, out, errOut)
		}
		return st
	}
	if st := gc("90", "80"); len(st.Evicted) != 0 {
		t.Fatalf("under the high watermark: evicted %v", st.Evicted)
	}
	if err := os.WriteFile(filepath.Join(disk, "other"), bytes.Repeat([]byte("x"), 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if st := gc("70", "60"); len(st.Evicted) != 1 || st.Evicted[0] != m.Digest {
		t.Fatalf("over the high watermark: evicted %v, want %s", st.Evicted, m.Digest)
	}
	for _, c := range []struct{ high, low, want string }{
		{"80", "90", "--low-watermark 90: want a percent from 0 to below --high-watermark (80)"},
		{"120", "10", "--high-watermark 120: want a percent of the cache's file system from 1 to 100"},
	} {
		code, _, errOut := run("cache", "gc", "--root", dir, "--high-watermark", c.high, "--low-watermark", c.low)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%s/%s: exit %d, want 2 with %q: %s", c.high, c.low, code, c.want, errOut)
		}
	}
}
