package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/hf"
	"github.com/modelpack/modelpack/artifact/layout"
	"github.com/modelpack/modelpack/internal/testenv"
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
	if strings.Join(slices.Sorted(slices.Values(paths)), " ") != "config.json generation_config.json" {
		t.Errorf("--include '*.json' --exclude 'tokenizer*' packed %v", paths)
	}
}

// A gated repository: without a token the error names HF_TOKEN; with one it packs, and the token appears in no
// output and never reaches the download host.
func TestPackHFGated(t *testing.T) {
	repo, _ := hubRepo(t, "acme/gated")
	const token = "hf_sEcReTtOkEn0123456789"
	repo.Token = token
	s := hubserver.Start(t, repo)
	hubEnv(t, s)
	home := t.TempDir()

	_, stderr, err := run(t, home, "pack", "hf://acme/gated", "-t", "gated:v1")
	if err == nil || !strings.Contains(err.Error(), "HF_TOKEN") || !strings.Contains(err.Error(), "401") {
		t.Fatalf("without a token: %v\n%s", err, stderr)
	}
	t.Setenv("HF_TOKEN", "hf_wrong")
	if _, _, err = run(t, home, "pack", "hf://acme/gated", "-t", "gated:v1"); err == nil || !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), "HF_TOKEN") {
		t.Fatalf("with a token lacking access: %v", err)
	}

	// The token file huggingface_hub's login writes, then HF_TOKEN.
	t.Setenv("HF_TOKEN", "")
	os.WriteFile(filepath.Join(os.Getenv("HF_HOME"), "token"), []byte(token+"\n"), 0o600)
	out, stderr, err := run(t, home, "pack", "hf://acme/gated", "-t", "gated:v1", "-o", "json")
	if err != nil {
		t.Fatalf("with the token file: %v\n%s", err, stderr)
	}
	os.Remove(filepath.Join(os.Getenv("HF_HOME"), "token"))
	t.Setenv("HF_TOKEN", token)
	out2, stderr2, err := run(t, home, "pack", "hf://acme/gated", "-t", "gated:v2", "--push=false")
	if err != nil {
		t.Fatalf("with HF_TOKEN: %v\n%s", err, stderr2)
	}
	if all := out + stderr + out2 + stderr2; strings.Contains(all, token) {
		t.Errorf("the token is in the output:\n%s", all)
	}
	for _, r := range s.Requests() {
		if r.Host == "download" && r.Auth != "" {
			t.Errorf("the download host received Authorization for %s", r.Path)
		}
	}
}

// Bytes that do not hash to what the Hub states are refused, naming the file, and nothing is tagged.
func TestPackHFCorruptLFS(t *testing.T) {
	repo, _ := hubRepo(t, "acme/tiny")
	s := hubserver.Start(t, repo)
	hubEnv(t, s)
	home := t.TempDir()
	s.Corrupt[s.SHA256("acme/tiny", hubShard)] = true
	_, _, err := run(t, home, "pack", "hf://acme/tiny", "-t", "tiny:bad")
	if err == nil || !strings.Contains(err.Error(), hubShard) || !strings.Contains(err.Error(), "digest mismatch") || strings.Contains(err.Error(), "resume") {
		t.Fatalf("pack of corrupted bytes: %v", err)
	}
	// Other files cut short when the pack stopped keep their partials for the next run; the corrupted one must not.
	if _, err := os.Stat(filepath.Join(home, "ingest", "sha256-"+s.SHA256("acme/tiny", hubShard)+".partial")); err == nil {
		t.Errorf("corrupted bytes of %s kept for a resume", hubShard)
	}
	if out, _, _ := run(t, home, "ls"); strings.Contains(out, "tiny") {
		t.Fatalf("something was tagged:\n%s", out)
	}
	// A file outside LFS is checked against its git blob id.
	s.Corrupt = map[string]bool{s.SHA256("acme/tiny", "config.json"): true}
	_, _, err = run(t, home, "pack", "hf://acme/tiny", "-t", "tiny:bad")
	if err == nil || !strings.Contains(err.Error(), "config.json") || !strings.Contains(err.Error(), "git blob id") {
		t.Fatalf("pack of a corrupted config.json: %v", err)
	}
	if out, _, _ := run(t, home, "ls"); strings.Contains(out, "tiny") {
		t.Fatalf("something was tagged:\n%s", out)
	}
}

// A Hub that accepts the connection and never answers, or stops half way through its file list, fails the pack
// within HF_HUB_DOWNLOAD_TIMEOUT with a message that says so, and nothing is tagged.
func TestPackHFSilentHub(t *testing.T) {
	repo, _ := hubRepo(t, "acme/tiny")
	s := hubserver.Start(t, repo)
	hubEnv(t, s)
	t.Setenv("HF_HUB_DOWNLOAD_TIMEOUT", "0.3")
	home := t.TempDir()
	hung := testenv.StartHungServer(t)
	t.Setenv("HF_ENDPOINT", "http://"+hung.Host)
	_, _, err := run(t, home, "pack", "hf://acme/tiny", "-t", "tiny:v1")
	if err == nil || !strings.Contains(err.Error(), "no byte for 300ms") || hung.Accepted() == 0 {
		t.Fatalf("pack from a Hub that never answers: %v (connections %d)", err, hung.Accepted())
	}
	t.Setenv("HF_ENDPOINT", s.URL)
	s.StallAPI["tree"] = 1
	if _, _, err := run(t, home, "pack", "hf://acme/tiny", "-t", "tiny:v1"); err == nil || !strings.Contains(err.Error(), "no byte for 300ms") {
		t.Fatalf("pack from a Hub stopping half way: %v", err)
	}
	if out, _, _ := run(t, home, "ls"); strings.Contains(out, "tiny") {
		t.Fatalf("something was tagged:\n%s", out)
	}
	if _, _, err := run(t, home, "pack", "hf://acme/tiny", "-t", "tiny:v1"); err != nil {
		t.Fatalf("pack once the Hub answers: %v", err)
	}
}

// A download cut part way resumes from the byte it stopped at (HTTP Range), and a rate-limited Hub is waited for
// as its Retry-After says.
func TestPackHFResumeAndRateLimit(t *testing.T) {
	repo, src := hubRepo(t, "acme/tiny")
	s := hubserver.Start(t, repo)
	hubEnv(t, s)
	home := t.TempDir()
	// merges.txt is in LFS and not a weight: its first GET is its download (a shard's is its header read).
	sha := s.SHA256("acme/tiny", "merges.txt")
	const cut = 10_000
	s.CutAfter[sha] = cut
	s.RateLimit = 2
	start := time.Now()
	if _, stderr, err := run(t, home, "pack", "hf://acme/tiny", "-t", "tiny:v1"); err != nil {
		t.Fatalf("pack: %v\n%s", err, stderr)
	}
	if waited := time.Since(start); waited < 2*time.Second {
		t.Errorf("two 429 answers with Retry-After: 1 were waited out in %s", waited)
	}
	reqs := s.Requests()
	if reqs[0].Host != "hub" || reqs[1].Path != reqs[0].Path || reqs[2].Path != reqs[0].Path {
		t.Errorf("the rate-limited request was not repeated: %+v", reqs[:3])
	}
	resumed := false
	for _, r := range reqs {
		resumed = resumed || (r.Host == "download" && r.Path == "/lfs/"+sha && r.Range == "bytes=10000-")
	}
	if !resumed {
		t.Errorf("no request resumed merges.txt at byte %d: %+v", cut, reqs)
	}
	_, m, _ := stored(t, home, "tiny:v1")
	b, _ := os.ReadFile(filepath.Join(src, "merges.txt"))
	if layerDigests(m)["merges.txt"] != digest.FromBytes(b) {
		t.Error("the resumed shard's layer is not the file")
	}
}

// The local Hub serves what the official client needs: @huggingface/hub's snapshotDownload (model info, the
// recursive tree, paths-info, resolve with Range and the LFS redirect) writes a Hub cache from it, gated
// repository included. modelpack packs that cache's snapshot; unpacked, it is the source tree, and pack hf:// of
// the same repository gives the same file digests.
func TestPackHFCacheOfTheOfficialClient(t *testing.T) {
	repo, src := hubRepo(t, "acme/tiny")
	const token = "hf_AnotherSecret42"
	repo.Token = token
	s := hubserver.Start(t, repo)
	hubEnv(t, s)
	cache := filepath.Join(t.TempDir(), "hub")
	snap := s.SnapshotDownload(t, "acme/tiny", "main", cache, token)
	commit := s.Commit("acme/tiny")
	if want := filepath.Join(cache, "models--acme--tiny", "snapshots", commit); snap != want {
		t.Fatalf("snapshot at %s, want %s", snap, want)
	}
	if b, _ := os.ReadFile(filepath.Join(cache, "models--acme--tiny", "refs", "main")); string(b) != commit {
		t.Errorf("refs/main = %q, want %s", b, commit)
	}
	fi, err := os.Lstat(filepath.Join(snap, hubShard))
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the client's snapshot holds no symlink for %s: %v %v", hubShard, fi, err)
	}
	var used []string
	for _, r := range s.Requests() {
		if r.Host == "hub" {
			used = append(used, r.Method+" "+r.Path+" "+r.Range)
		}
	}
	for _, want := range []string{"GET /api/models/acme/tiny/revision/main", "GET /api/models/acme/tiny/tree/" + commit,
		"POST /api/models/acme/tiny/paths-info/" + commit, "GET /acme/tiny/resolve/" + commit + "/" + hubShard + " bytes=0-0"} {
		if !strings.Contains(strings.Join(used, "\n"), want) {
			t.Errorf("the client made no request %q:\n%s", want, strings.Join(used, "\n"))
		}
	}

	home := t.TempDir()
	if _, stderr, err := run(t, home, "pack", snap, "-t", "cache:v1"); err != nil {
		t.Fatalf("pack the client's snapshot: %v\n%s", err, stderr)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, stderr, err := run(t, home, "unpack", "cache:v1", out); err != nil {
		t.Fatalf("unpack: %v\n%s", err, stderr)
	}
	if diff, err := exec.Command("diff", "-r", src, out).CombinedOutput(); err != nil {
		t.Fatalf("diff -r source unpacked: %v\n%s", err, diff)
	}

	t.Setenv("HF_TOKEN", token)
	if _, stderr, err := run(t, home, "pack", "hf://acme/tiny", "-t", "hub:v1"); err != nil {
		t.Fatalf("pack hf://: %v\n%s", err, stderr)
	}
	_, fromCache, _ := stored(t, home, "cache:v1")
	_, fromHub, _ := stored(t, home, "hub:v1")
	a, b := layerDigests(fromCache), layerDigests(fromHub)
	if len(a) != len(b) {
		t.Errorf("the cache packs %d files, the Hub %d", len(a), len(b))
	}
	for p, d := range b {
		if a[p] != d {
			t.Errorf("%s: %s from the cache, %s from the Hub", p, a[p], d)
		}
	}

	// The whole repository's cache directory is refused, naming the snapshot to pack.
	_, _, err = run(t, home, "pack", filepath.Join(cache, "models--acme--tiny"), "-t", "cache:root")
	if err == nil || !strings.Contains(err.Error(), "modelpack pack "+filepath.Join(cache, "models--acme--tiny", "snapshots", commit)) {
		t.Errorf("pack of the cache root: %v", err)
	}
}

// pack hf:// --push streams the LFS files from the Hub into the registry: no local copy, each weight read once for
// its upload (and its header once for the config), memory bounded, the same digest as a pack into the store.
// Corrupted bytes are refused before anything is tagged in the registry.
func TestPackHFPush(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	repo, _ := hubRepo(t, "acme/tiny")
	big := filepath.Join(t.TempDir(), "big.safetensors")
	if err := testmodel.WriteShard(big, 48<<20, 99); err != nil {
		t.Fatal(err)
	}
	repo.Files["big.safetensors"], _ = os.ReadFile(big)
	s := hubserver.Start(t, repo)
	hubEnv(t, s)
	home := t.TempDir()
	if _, stderr, err := run(t, home, "pack", "hf://acme/tiny", "-t", "tiny:v1"); err != nil {
		t.Fatalf("pack: %v\n%s", err, stderr)
	}
	local, _, _ := stored(t, home, "tiny:v1")

	pushHome := t.TempDir()
	before := len(s.Requests())
	ref := reg.Host + "/org/tiny:v1"
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	out, stderr, err := run(t, pushHome, "pack", "hf://acme/tiny", "-t", ref, "--push", "--plain-http", "-o", "json")
	runtime.ReadMemStats(&ms1)
	if err != nil {
		t.Fatalf("pack --push: %v\n%s", err, stderr)
	}
	t.Logf("pack --push of %d MiB allocated %d MiB", (len(repo.Files["big.safetensors"])+512<<10)>>20, (ms1.TotalAlloc-ms0.TotalAlloc)>>20)
	if alloc := ms1.TotalAlloc - ms0.TotalAlloc; alloc > 24<<20 {
		t.Errorf("pack --push of a 48 MiB weight allocated %d MiB", alloc>>20)
	}
	var res struct {
		Descriptor ocispec.Descriptor `json:"descriptor"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Descriptor.Digest != local.Digest {
		t.Fatalf("pushed %s (%v), the store's pack is %s\n%s", res.Descriptor.Digest, err, local.Digest, out)
	}
	reads := map[string]int{}
	for _, r := range s.Requests()[before:] {
		if r.Host == "download" {
			reads[strings.TrimPrefix(r.Path, "/lfs/")]++
		}
	}
	for p, want := range map[string]int{"big.safetensors": 2, hubShard: 2, "merges.txt": 1} {
		if n := reads[s.SHA256("acme/tiny", p)]; n != want {
			t.Errorf("%s read %d times from the Hub, want %d (its header, then its upload)", p, n, want)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(pushHome, "blobs", "sha256")); len(entries) > 0 {
		t.Errorf("pack --push left %d blobs in the local store", len(entries))
	}
	if _, err := runRemoteCLI(t, "", "inspect", "--remote", "--plain-http", ref); err != nil {
		t.Fatalf("inspect the pushed artifact: %v", err)
	}

	// Into another repository, which does not hold the blob already (a registry that does is not asked for it).
	s.Corrupt[s.SHA256("acme/tiny", "big.safetensors")] = true
	bad := reg.Host + "/other/tiny:bad"
	_, _, err = run(t, pushHome, "pack", "hf://acme/tiny", "-t", bad, "--push", "--plain-http")
	if err == nil || !strings.Contains(err.Error(), "big.safetensors") || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("pack --push of corrupted bytes: %v", err)
	}
	if _, err := runRemoteCLI(t, "", "inspect", "--remote", "--plain-http", bad); err == nil {
		t.Fatal("the corrupted pack was tagged in the registry")
	}
}

// With --layer-format tar the LFS files of a sub-directory go into its archive, read from the Hub and checked
// there too; unpacked, the model is the source.
func TestPackHFTarLayers(t *testing.T) {
	repo, src := hubRepo(t, "acme/tiny")
	big := bytes.Repeat([]byte("vocab\n"), 4<<10) // 24 KiB: LFS
	repo.Files["docs/vocab.txt"] = big
	os.WriteFile(filepath.Join(src, "docs", "vocab.txt"), big, 0o644)
	s := hubserver.Start(t, repo)
	hubEnv(t, s)
	home := t.TempDir()
	if _, stderr, err := run(t, home, "pack", "hf://acme/tiny", "-t", "tiny:tar", "--layer-format", "tar+zstd"); err != nil {
		t.Fatalf("pack: %v\n%s", err, stderr)
	}
	_, m, _ := stored(t, home, "tiny:tar")
	if _, ok := layerDigests(m)["docs"]; !ok {
		t.Fatalf("no docs archive: %v", layerDigests(m))
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, stderr, err := run(t, home, "unpack", "tiny:tar", out); err != nil {
		t.Fatalf("unpack: %v\n%s", err, stderr)
	}
	if diff, err := exec.Command("diff", "-r", src, out).CombinedOutput(); err != nil {
		t.Fatalf("diff -r: %v\n%s", err, diff)
	}
	s.Corrupt[s.SHA256("acme/tiny", "docs/vocab.txt")] = true
	_, _, err := run(t, home, "pack", "hf://acme/tiny", "-t", "tiny:bad", "--layer-format", "tar")
	if err == nil || !strings.Contains(err.Error(), "docs/vocab.txt") || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("a corrupted file in an archive: %v", err)
	}
}
