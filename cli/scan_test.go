package cli

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testenv/hubserver"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// Item: `modelpack scan DIR` (the built binary) gives every generated hostile and benign vector the verdict
// expect.json records, exits 1 naming how many files are refused, and exits 0 on a model of data only. The same
// files packed into the local store give the same verdicts by reference, and pushed to a real registry, by its
// reference.
func TestScanVectors(t *testing.T) {
	run := binaryRunner(t)
	src := filepath.Join(testenv.RepoRoot(), "scan", "testdata", "vectors")
	raw, err := os.ReadFile(filepath.Join(src, "expect.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]struct{ Format, Verdict, Callable string }
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	refused := 0
	for name, w := range want {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if w.Verdict != "data" {
			refused++
		}
	}
	type doc struct {
		Files []struct {
			Path, Format, Verdict, Reason string
			Findings                      []struct{ Verdict, Callable string }
		}
	}
	check := func(what string, code int, out, errOut string) {
		t.Helper()
		if code != 1 || !strings.Contains(errOut, "of "+strconv.Itoa(len(want))+" files are code or malformed") || !strings.Contains(errOut, strconv.Itoa(refused)+" of") {
			t.Fatalf("%s: exit %d, stderr %q", what, code, errOut)
		}
		var d doc
		if err := json.Unmarshal([]byte(out), &d); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, out)
		}
		if len(d.Files) != len(want) {
			t.Fatalf("%s: %d files reported, want %d", what, len(d.Files), len(want))
		}
		for _, f := range d.Files {
			w := want[f.Path]
			if f.Format != w.Format || f.Verdict != w.Verdict {
				t.Errorf("%s: %s is %s/%s (%s), want %s/%s", what, f.Path, f.Format, f.Verdict, f.Reason, w.Format, w.Verdict)
			}
			named := false
			for _, x := range f.Findings {
				named = named || x.Callable == w.Callable
			}
			if w.Callable != "" && !named {
				t.Errorf("%s: %s does not name %s: %+v", what, f.Path, w.Callable, f.Findings)
			}
		}
	}
	code, out, errOut := run("scan", dir, "-o", "json")
	check("scan DIR", code, out, errOut)

	home := t.TempDir()
	if code, _, errOut := run("--home", home, "pack", dir, "-t", "vectors:v1", "-q"); code != 0 {
		t.Fatalf("pack: %s", errOut)
	}
	code, out, errOut = run("--home", home, "scan", "vectors:v1", "-o", "json")
	check("scan REF", code, out, errOut)

	// A registry reference the store lacks is pulled into a temporary store, scanned and dropped.
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	remoteRef := reg.Host + "/scan/vectors:v1"
	if code, _, errOut := run("--home", home, "push", remoteRef, "--from", "vectors:v1", "--plain-http", "-q"); code != 0 {
		t.Fatalf("push: %s", errOut)
	}
	empty := t.TempDir()
	code, out, errOut = run("--home", empty, "scan", remoteRef, "--plain-http", "-o", "json")
	check("scan registry REF", code, out, errOut)
	if blobs, _ := os.ReadDir(filepath.Join(empty, "blobs", "sha256")); len(blobs) > 0 {
		t.Errorf("scanning a registry reference left %d blobs in the local store", len(blobs))
	}

	// The table names the file, its format and the first callable.
	_, out, _ = run("scan", dir)
	for _, line := range []string{"evil_torch.pt", "pytorch-zip", "archive/data.pkl: imports posix.system"} {
		if !strings.Contains(out, line) {
			t.Errorf("table lacks %q:\n%s", line, out)
		}
	}
	if code, out, _ := run("scan", filepath.Join(dir, "evil_torch.pt")); code != 1 || !strings.Contains(out, "evil_torch.pt  pytorch-zip  code") {
		t.Errorf("one file: exit %d\n%s", code, out)
	}
	if code, out, errOut := run("scan", smallModel(t)); code != 0 || !strings.Contains(out, "safetensors  data") {
		t.Fatalf("a model of data: exit %d\n%s%s", code, out, errOut)
	}
}

// Item: scan --policy judges as the node does: allowCode and exceptions let files through, the rest are refused,
// and the exit code follows the policy rather than the verdicts.
func TestScanPolicy(t *testing.T) {
	run := binaryRunner(t)
	src := filepath.Join(testenv.RepoRoot(), "scan", "testdata", "vectors")
	dir := t.TempDir()
	for _, n := range []string{"evil_torch.pt", "ok.safetensors", "config.json"} {
		b, err := os.ReadFile(filepath.Join(src, n))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, n), b, 0o644)
	}
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(policy, []byte(`default: {none: true}
rules:
- name: trusted
  match: ["registry.example.com/trusted/**"]
  none: true
  allowCode: true
- name: team
  match: ["registry.example.com/team/**"]
  none: true
  exceptions: [{reference: "registry.example.com/team/ok", path: "*.pt"}]
`), 0o644)
	for ref, wantCode := range map[string]int{
		"registry.example.com/trusted/m:1":  0,
		"registry.example.com/team/ok:1":    0,
		"registry.example.com/team/other:1": 1,
		"elsewhere.example.com/m:1":         1,
	} {
		code, out, errOut := run("scan", dir, "--policy", policy, "--reference", ref, "-o", "json")
		if code != wantCode {
			t.Errorf("%s: exit %d, want %d\n%s%s", ref, code, wantCode, out, errOut)
		}
		if wantCode == 1 && (!strings.Contains(out, `"refused": "unsafe model content: `+ref) || !strings.Contains(errOut, "1 of 3 files are refused by")) {
			t.Errorf("%s: the refusal is not named:\n%s%s", ref, out, errOut)
		}
	}
	if code, _, errOut := run("scan", dir, "--policy", policy); code != 1 || !strings.Contains(errOut, "--reference") {
		t.Errorf("a directory under --policy without --reference: exit %d, %s", code, errOut)
	}
}

// Item: scan hf://ORG/NAME scans a Hub model where it lies (a local Hub, as the Hub import tests use): every file
// gets its verdict, and a large safetensors shard costs range reads of its header, not its download.
func TestScanHub(t *testing.T) {
	src := filepath.Join(testenv.RepoRoot(), "scan", "testdata", "vectors")
	files := map[string][]byte{}
	for _, n := range []string{"evil_torch.pt", "config.json", "object.npy"} {
		b, err := os.ReadFile(filepath.Join(src, n))
		if err != nil {
			t.Fatal(err)
		}
		files[n] = b
	}
	shard := filepath.Join(t.TempDir(), "model.safetensors")
	if err := testmodel.WriteShard(shard, 64<<20, 1); err != nil {
		t.Fatal(err)
	}
	files["model.safetensors"], _ = os.ReadFile(shard)
	hub := hubserver.Start(t, hubserver.Repo{Name: "acme/m", Files: files})
	run := binaryRunner(t, "HF_ENDPOINT="+hub.URL, "HF_TOKEN=", "HF_HOME="+t.TempDir())
	code, out, errOut := run("scan", "hf://acme/m", "-o", "json")
	if code != 1 || !strings.Contains(errOut, "2 of 4 files are code or malformed") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	var d struct {
		Files []struct{ Path, Format, Verdict string }
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range d.Files {
		got[f.Path] = f.Format + "/" + f.Verdict
	}
	want := map[string]string{"evil_torch.pt": "pytorch-zip/code", "config.json": "json/data", "object.npy": "npy/code", "model.safetensors": "safetensors/data"}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s: %s, want %s", p, got[p], w)
		}
	}
	n := 0
	for _, r := range hub.Requests() {
		if strings.HasSuffix(r.Path, "model.safetensors") && r.Method == "GET" {
			n++
		}
	}
	t.Logf("%d GETs of the 64 MiB safetensors shard", n)
	if n == 0 || n > 4 {
		t.Errorf("%d GETs of the safetensors shard, want a few range reads", n)
	}
}

// Item: pack warns about each file that runs code when loaded, naming its format and first callable, and
// --refuse-code fails before anything is written.
func TestPackWarnsOnCode(t *testing.T) {
	run := binaryRunner(t)
	model := smallModel(t)
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "scan", "testdata", "vectors", "evil_torch.pt"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(model, "pytorch_model.bin"), b, 0o644)
	home := t.TempDir()
	code, out, errOut := run("--home", home, "pack", model, "-t", "m:v1", "-o", "json")
	if code != 0 || !strings.Contains(out, "pytorch_model.bin is code (pytorch-zip): imports posix.system") {
		t.Fatalf("pack: exit %d\n%s%s", code, out, errOut)
	}
	home = t.TempDir()
	code, _, errOut = run("--home", home, "pack", model, "-t", "m:v1", "--refuse-code")
	if code != 1 || !strings.Contains(errOut, "--refuse-code: pytorch_model.bin is code (pytorch-zip): imports posix.system") {
		t.Fatalf("pack --refuse-code: exit %d\n%s", code, errOut)
	}
	if code, out, _ := run("--home", home, "list", "-o", "json"); code != 0 || strings.Contains(out, "m:v1") {
		t.Fatalf("pack --refuse-code stored something: %s", out)
	}
}

// Item (issue 35): push warns about each layer that runs code when loaded, as pack does, and --refuse-code fails
// before a single request reaches the registry (counted at a proxy in front of a real one).
func TestPushWarnsOnCode(t *testing.T) {
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir())
	model := smallModel(t)
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "scan", "testdata", "vectors", "evil_torch.pt"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(model, "pytorch_model.bin"), b, 0o644)
	home := t.TempDir()
	if code, _, errOut := run("--home", home, "pack", model, "-t", "m:v1"); code != 0 {
		t.Fatalf("pack: exit %d\n%s", code, errOut)
	}
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	var requests atomic.Int64
	proxy := testenv.StartProxy(t, reg.Host, testenv.ProxyHooks{Request: func(http.ResponseWriter, *http.Request) bool {
		requests.Add(1)
		return true
	}})

	code, _, errOut := run("--home", home, "push", proxy.Host+"/org/m:v1", "--from", "m:v1", "--refuse-code")
	if code != 1 || !strings.Contains(errOut, "--refuse-code: pytorch_model.bin is code (pytorch-zip): imports posix.system") {
		t.Fatalf("push --refuse-code: exit %d\n%s", code, errOut)
	}
	if n := requests.Load(); n != 0 {
		t.Fatalf("push --refuse-code sent %d requests to the registry", n)
	}

	code, _, errOut = run("--home", home, "push", proxy.Host+"/org/m:v1", "--from", "m:v1")
	if code != 0 || !strings.Contains(errOut, "warning: pytorch_model.bin is code (pytorch-zip): imports posix.system") {
		t.Fatalf("push: exit %d\n%s", code, errOut)
	}
	code, out, errOut := run("--home", home, "push", proxy.Host+"/org/m:v1", "--from", "m:v1", "-o", "json")
	var res struct{ Warnings []string }
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || len(res.Warnings) != 1 ||
		!strings.HasPrefix(res.Warnings[0], "pytorch_model.bin is code (pytorch-zip): imports posix.system") || errOut != "" {
		t.Fatalf("push -o json: exit %d\n%s%s", code, out, errOut)
	}
}
