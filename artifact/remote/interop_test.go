package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/pack"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

func runTool(t testing.TB, dir, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", filepath.Base(bin), args, err, out)
	}
}

func TestOrasPullsWhatModelpackPushes(t *testing.T) {
	oras := testenv.Tool(t, "oras")
	reg, opts := plainRegistry(t)
	m := buildModel(t, 512<<10)
	if _, err := Push(context.Background(), m.store, m.ref, repoFor(t, reg.Host+"/interop/model:v1", opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	runTool(t, out, oras, "pull", "--plain-http", "-o", out, reg.Host+"/interop/model:v1")
	for _, name := range []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json"} {
		got, err := os.ReadFile(filepath.Join(out, name))
		if err != nil || !bytes.Equal(got, m.files[name]) {
			t.Fatalf("oras pull wrote %s wrongly: %v", name, err)
		}
	}
}

func TestModelpackFetchesWhatOrasPushes(t *testing.T) {
	oras := testenv.Tool(t, "oras")
	reg, opts := plainRegistry(t)
	src := t.TempDir()
	files := map[string][]byte{
		"model.safetensors": randBytes(t, 300<<10),
		"tokenizer.json":    []byte(`{"version":"1.0"}`),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg, _ := json.Marshal(artifact.Model{ModelFS: artifact.ModelFS{Type: "layers"}})
	if err := os.WriteFile(filepath.Join(src, "config.cfg"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	runTool(t, src, oras, "push", "--plain-http", reg.Host+"/interop/oras:v1",
		"--artifact-type", artifact.ArtifactTypeModelManifest,
		"--config", "config.cfg:"+artifact.MediaTypeModelConfig,
		"model.safetensors:"+artifact.LayerMediaType(artifact.KindWeight, artifact.FormatRaw),
		"tokenizer.json:"+artifact.LayerMediaType(artifact.KindWeightConfig, artifact.FormatRaw))
	dir := t.TempDir()
	res, err := Fetch(context.Background(), repoFor(t, reg.Host+"/interop/oras:v1", opts), dir, FetchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("fetched %s wrongly: %v", name, err)
		}
	}
	if len(res.Files) != 2 {
		t.Fatalf("fetch wrote %v, want the two files", res.Files)
	}
}

func TestPackSinkStreamsToRegistry(t *testing.T) {
	ctx := context.Background()
	reg, opts := plainRegistry(t)
	model := t.TempDir()
	if err := testmodel.Generate(model, testmodel.Spec{Shards: 2, ShardSize: 256 << 10, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	repo := repoFor(t, reg.Host+"/packed/model:v1", opts)
	sink := PackSink(repo, nil, nil)
	desc, err := pack.Pack(ctx, model, pack.Options{Tag: reg.Host + "/packed/model:v1"}, sink)
	if err != nil {
		t.Fatal(err)
	}
	res := sink.Result()
	if res.Descriptor.Digest != desc.Digest || res.Transferred == 0 {
		t.Fatalf("pack --push result %+v", res)
	}
	dir := t.TempDir()
	if _, err := Fetch(ctx, repoFor(t, reg.Host+"/packed/model:v1", opts), dir, FetchOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{testmodel.ShardName(0, 2), testmodel.ShardName(1, 2), "config.json", "README.md"} {
		want, _ := os.ReadFile(filepath.Join(model, name))
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s after pack --push and fetch: %v", name, err)
		}
	}
	// Packing the same model again sends no layer bytes.
	sink2 := PackSink(repoFor(t, reg.Host+"/packed/model:v1", opts), nil, nil)
	if _, err := pack.Pack(ctx, model, pack.Options{Tag: "v1"}, sink2); err != nil {
		t.Fatal(err)
	}
	if n := sink2.Result().Transferred; n != 0 {
		t.Fatalf("a second pack --push sent %d layer bytes, want 0", n)
	}
}
