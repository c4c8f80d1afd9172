package cli

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testenv/hubserver"
)

// runBin runs the real CLI with env added to the test's environment.
func runBin(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(testenv.Modelpack(t), args...)
	cmd.Env = append(os.Environ(), env...)
	b, _ := cmd.CombinedOutput()
	return string(b), cmd.ProcessState.ExitCode()
}

// trapHub is a Hub endpoint that fails the test on any request: under HF_HUB_OFFLINE nothing may reach it.
func trapHub(t *testing.T) string {
	t.Helper()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		t.Errorf("HF_HUB_OFFLINE: the Hub was asked %s %s", r.Method, r.URL)
		http.Error(w, "offline", http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// HF_HUB_OFFLINE=1: pack hf:// reads huggingface_hub's cache, laid out by the official client, and packs the same
// layers as from the Hub, by branch, tag-less commit or refs/ name; what the cache lacks fails naming the cache
// and the command that fills it; the Hub endpoint is never contacted.
func TestPackHFOffline(t *testing.T) {
	repo, _ := hubRepo(t, "acme/tiny")
	s := hubserver.Start(t, repo)
	hubEnv(t, s)
	cache := filepath.Join(t.TempDir(), "hub")
	s.SnapshotDownload(t, "acme/tiny", "main", cache, "")
	commit := s.Commit("acme/tiny")

	online := t.TempDir()
	if out, code := runBin(t, []string{"MODELPACK_HOME=" + online}, "pack", "hf://acme/tiny", "-t", "hub:v1"); code != 0 {
		t.Fatalf("pack online: exit %d\n%s", code, out)
	}
	_, fromHub, _ := stored(t, online, "hub:v1")

	home := t.TempDir()
	env := []string{"MODELPACK_HOME=" + home, "HF_HUB_OFFLINE=1", "HF_ENDPOINT=" + trapHub(t), "HF_HUB_CACHE=" + cache}
	for tag, ref := range map[string]string{"main:v1": "hf://acme/tiny", "commit:v1": "hf://acme/tiny@" + commit} {
		if out, code := runBin(t, env, "pack", ref, "-t", tag); code != 0 {
			t.Fatalf("pack %s offline: exit %d\n%s", ref, code, out)
		}
		_, m, cfg := stored(t, home, tag)
		a, b := layerDigests(m), layerDigests(fromHub)
		if len(a) != len(b) {
			t.Errorf("%s: the cache packs %d files, the Hub %d", ref, len(a), len(b))
		}
		for p, d := range b {
			if a[p] != d {
				t.Errorf("%s: %s: %s from the cache, %s from the Hub", ref, p, a[p], d)
			}
		}
		if cfg.Descriptor.Revision != commit || cfg.Descriptor.Name != "tiny" {
			t.Errorf("%s: descriptor %+v", ref, cfg.Descriptor)
		}
	}
	// HF_HOME/hub is the default cache, as for huggingface_hub.
	home2 := filepath.Dir(cache)
	env2 := []string{"MODELPACK_HOME=" + home, "HF_HUB_OFFLINE=true", "HF_ENDPOINT=" + trapHub(t), "HF_HUB_CACHE=", "HUGGINGFACE_HUB_CACHE=", "HF_HOME=" + home2}
	if out, code := runBin(t, env2, "pack", "hf://acme/tiny", "-t", "home:v1"); code != 0 {
		t.Fatalf("pack offline from $HF_HOME/hub: exit %d\n%s", code, out)
	}

	for ref, want := range map[string]string{
		"hf://acme/absent":                          "hf://acme/absent@main: not in the local Hub cache " + cache,
		"hf://acme/tiny@v9":                         `no revision "v9" (refs/v9)`,
		"hf://acme/tiny@" + strings.Repeat("a", 40): "no snapshot of commit " + strings.Repeat("a", 40),
		"hf://datasets/acme/x":                      "hf download acme/x --revision main --repo-type dataset",
	} {
		out, code := runBin(t, env, "pack", ref, "-t", "x:v1")
		if code != 1 || !strings.Contains(out, want) || !strings.Contains(out, "HF_HUB_OFFLINE is set") {
			t.Errorf("pack %s offline: exit %d, want 1 with %q:\n%s", ref, code, want, out)
		}
	}
	if out, code := runBin(t, env, "scan", "hf://acme/tiny"); code == 0 || !strings.Contains(out, filepath.Join(cache, "models--acme--tiny", "snapshots", commit)) {
		t.Errorf("scan hf:// offline: exit %d, want a refusal naming the cached snapshot:\n%s", code, out)
	}
}

// hf://datasets/ORG/NAME packs a dataset repository through the Hub's datasets API: its data files as the
// dataset kind, its card as a doc, a --kind rule still winning for the files it names.
func TestPackHFDataset(t *testing.T) {
	s := hubserver.Start(t, hubserver.Repo{Name: "datasets/acme/corpus", Files: map[string][]byte{
		"README.md":                         []byte("---\nlicense: mit\n---\n# corpus\n"),
		"data/train-00000-of-00001.parquet": []byte(strings.Repeat("PAR1", 8<<10)),
		"data/test.jsonl":                   []byte("{\"text\": \"hello\"}\n"),
		"scripts/load.py":                   []byte("print('load')\n"),
	}, CardData: map[string]any{"license": "mit"}})
	hubEnv(t, s)
	home := t.TempDir()
	out, code := runBin(t, []string{"MODELPACK_HOME=" + home}, "pack", "hf://datasets/acme/corpus", "-t", "corpus:v1", "--kind", "code=scripts/*.py")
	if code != 0 {
		t.Fatalf("pack a dataset: exit %d\n%s", code, out)
	}
	_, m, cfg := stored(t, home, "corpus:v1")
	want := map[string]artifact.Kind{"README.md": artifact.KindDoc, "data/train-00000-of-00001.parquet": artifact.KindDataset,
		"data/test.jsonl": artifact.KindDataset, "scripts/load.py": artifact.KindCode}
	if len(m.Layers) != len(want) {
		t.Fatalf("%d layers, want %d: %+v", len(m.Layers), len(want), m.Layers)
	}
	for _, l := range m.Layers {
		p := l.Annotations[artifact.AnnotationFilepath]
		k, _, _ := artifact.ParseLayerMediaType(l.MediaType)
		if k != want[p] {
			t.Errorf("%s: kind %s, want %s", p, k, want[p])
		}
	}
	if cfg.Descriptor.SourceURL != s.URL+"/datasets/acme/corpus" || cfg.Descriptor.Revision != s.Commit("datasets/acme/corpus") || strings.Join(cfg.Descriptor.Licenses, ",") != "MIT" {
		t.Errorf("descriptor %+v", cfg.Descriptor)
	}
	var api []string
	for _, r := range s.Requests() {
		if r.Host == "hub" && strings.HasPrefix(r.Path, "/api/") {
			api = append(api, r.Path)
		}
	}
	if len(api) == 0 || !strings.HasPrefix(api[0], "/api/datasets/acme/corpus/") {
		t.Errorf("requests %v, want the datasets API", api)
	}
}
