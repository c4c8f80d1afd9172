package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/hf"
	"github.com/modelpack/modelpack/artifact/layout"
	"github.com/modelpack/modelpack/internal/testenv/hubserver"
	"github.com/modelpack/modelpack/internal/testmodel"
)

const hubShard = "model-00001-of-00002.safetensors"

// hubRepo is a small model as a Hub repository: two safetensors shards in LFS, configs, a tokenizer large enough
// for LFS, docs in a sub-directory and the .gitattributes every Hub repository has.
func hubRepo(t *testing.T, name string) (hubserver.Repo, string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	if err := testmodel.Generate(src, testmodel.Spec{Shards: 2, ShardSize: 256 << 10, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(src, "docs"), 0o755)
	os.WriteFile(filepath.Join(src, "docs", "usage.md"), []byte("# usage\n"), 0o644)
	os.WriteFile(filepath.Join(src, "merges.txt"), bytes.Repeat([]byte("a b\n"), 8<<10), 0o644) // 32 KiB: LFS
	files := map[string][]byte{".gitattributes": []byte("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")}
	filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(src, p)
			files[filepath.ToSlash(rel)], _ = os.ReadFile(p)
		}
		return err
	})
	return hubserver.Repo{
		Name: name, Files: files, LibraryName: "transformers", Tags: []string{"v1.0"},
		CardData: map[string]any{"license": "apache-2.0", "base_model": "acme/base", "datasets": []string{"acme/corpus"}},
	}, src
}

// hubEnv points the CLI at the local Hub with no token from the environment or a token file.
func hubEnv(t *testing.T, s *hubserver.Server) {
	t.Setenv("HF_ENDPOINT", s.URL)
	t.Setenv("HF_TOKEN", "")
	t.Setenv("HF_HOME", t.TempDir())
	t.Setenv("HF_TOKEN_PATH", "")
}

// stored reads a tag's manifest and config from a local store.
func stored(t *testing.T, home, ref string) (ocispec.Descriptor, ocispec.Manifest, artifact.Model) {
	t.Helper()
	s, err := layout.Open(home)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	desc, err := s.Resolve(ctx, ref)
	if err != nil {
		t.Fatalf("resolve %s: %v", ref, err)
	}
	var m ocispec.Manifest
	b, err := content.FetchAll(ctx, s, desc)
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	if err != nil {
		t.Fatal(err)
	}
	var cfg artifact.Model
	b, err = content.FetchAll(ctx, s, m.Config)
	if err == nil {
		err = json.Unmarshal(b, &cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	return desc, m, cfg
}

// layerDigests maps each layer's file path to its digest.
func layerDigests(m ocispec.Manifest) map[string]digest.Digest {
	out := map[string]digest.Digest{}
	for _, l := range m.Layers {
		out[l.Annotations[artifact.AnnotationFilepath]] = l.Digest
	}
	return out
}

func TestPackHF(t *testing.T) {
	repo, src := hubRepo(t, "acme/tiny")
	s := hubserver.Start(t, repo)
	s.PageSize = 3 // the tree comes in pages
	hubEnv(t, s)
	home := t.TempDir()
	commit := s.Commit("acme/tiny")

	out, stderr, err := run(t, home, "pack", "hf://acme/tiny", "-t", "tiny:v1")
	if err != nil {
		t.Fatalf("pack: %v\n%s", err, stderr)
	}
	if !strings.Contains(out, "packed tiny:v1 into the local store") {
		t.Errorf("output: %s", out)
	}
	desc, m, cfg := stored(t, home, "tiny:v1")

	// Every file but .gitattributes, each raw layer holding exactly the source's bytes.
	got := layerDigests(m)
	want := map[string]digest.Digest{}
	filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(src, p)
			b, _ := os.ReadFile(p)
			want[filepath.ToSlash(rel)] = digest.FromBytes(b)
		}
		return err
	})
	if len(got) != len(want) {
		t.Errorf("layers %v, want the files %v", got, want)
	}
	for p, d := range want {
		if got[p] != d {
			t.Errorf("%s: layer %s, file %s", p, got[p], d)
		}
	}

	d := cfg.Descriptor
	if d.SourceURL != s.URL+"/acme/tiny" || d.Revision != commit || strings.Join(d.Licenses, ",") != "Apache-2.0" ||
		d.Name != "tiny" || d.CreatedAt == nil || !d.CreatedAt.Equal(time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)) ||
		strings.Join(d.DatasetsURL, ",") != s.URL+"/datasets/acme/corpus" {
		t.Errorf("descriptor %+v", d)
	}
	if cfg.Config.ParamSize == "" || cfg.Config.Format != "safetensors" || cfg.Config.Precision != "bfloat16" {
		t.Errorf("config not inferred from the remote shards' headers: %+v", cfg.Config)
	}
	for k, v := range map[string]string{hf.AnnotationLibrary: "transformers", hf.AnnotationBaseModel: "acme/base",
		ocispec.AnnotationRevision: commit, ocispec.AnnotationSource: s.URL + "/acme/tiny"} {
		if m.Annotations[k] != v {
			t.Errorf("annotation %s = %q, want %q", k, m.Annotations[k], v)
		}
	}

	// The same revision, named by branch, tag or commit, packs to the same digest, and the LFS files the store
	// holds are not fetched again: only the shards' headers are read, once a shard, for the config.
	before := len(s.Requests())
	for i, rev := range []string{"main", "v1.0", commit} {
		tag := "tiny:again" + string(rune('0'+i))
		if _, stderr, err := run(t, home, "pack", "hf://acme/tiny@"+rev, "-t", tag); err != nil {
			t.Fatalf("pack @%s: %v\n%s", rev, err, stderr)
		}
		if again, _, _ := stored(t, home, tag); again.Digest != desc.Digest {
			t.Errorf("@%s packed to %s, first pack %s", rev, again.Digest, desc.Digest)
		}
	}
	reads := map[string]int{}
	for _, r := range s.Requests()[before:] {
		if r.Host == "download" {
			reads[strings.TrimPrefix(r.Path, "/lfs/")]++
		}
	}
	if n := reads[s.SHA256("acme/tiny", "merges.txt")]; n != 0 {
		t.Errorf("three repacks fetched merges.txt %d times", n)
	}
	for _, shard := range []string{hubShard, "model-00002-of-00002.safetensors"} {
		if n := reads[s.SHA256("acme/tiny", shard)]; n != 3 {
			t.Errorf("three repacks read %s %d times, want once each for its header", shard, n)
		}
	}

	// --include/--exclude choose files.
	if _, stderr, err := run(t, home, "pack", "hf://acme/tiny", "-t", "tiny:cfg", "--include", "*.json", "--exclude", "tokenizer*"); err != nil {
		t.Fatalf("pack --include: %v\n%s", err, stderr)
	}
	_, m, _ = stored(t, home, "tiny:cfg")
	var paths []string
	for p := range layerDigests(m) {
		paths = append(paths, p)
	}
	if strings.Join(sortedStrings(paths), " ") != "config.json generation_config.json" {
		t.Errorf("--include '*.json' --exclude 'tokenizer*' packed %v", paths)
	}
}

func sortedStrings(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}
