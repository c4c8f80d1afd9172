package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testenv/hubserver"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// tourScript is the sh block under "## A short tour" in README.md, as written.
func tourScript(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, tour, ok := strings.Cut(string(b), "## A short tour")
	if !ok {
		t.Fatal("README.md has no tour")
	}
	_, block, ok := strings.Cut(tour, "```sh\n")
	if !ok {
		t.Fatal("the tour has no sh block")
	}
	script, _, _ := strings.Cut(block, "```")
	return script
}

// The README's tour, run by bash with the built binary against a real registry: only the registry's port differs
// from what the README says (localhost:5000). deploy's TestDocCommandsRunOrAreListed runs (or lists, with the
// reason) every other shell command of README.md and deploy/README.md.
func TestReadmeTourRunsAsWritten(t *testing.T) {
	bin := testenv.Modelpack(t)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	script := tourScript(t)
	if !strings.Contains(script, "localhost:5000/") {
		t.Fatal("the tour names no localhost:5000 registry")
	}
	port := reg.Host[strings.LastIndex(reg.Host, ":"):]
	script = strings.ReplaceAll(script, "localhost:5000", "localhost"+port)
	work := t.TempDir()
	if err := testmodel.Generate(filepath.Join(work, "llama-3-8b"), testmodel.Small); err != nil {
		t.Fatal(err)
	}
	// The Hub the tour packs from: a local one serving the model it names.
	hubModel := filepath.Join(t.TempDir(), "qwen")
	if err := testmodel.Generate(hubModel, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	entries, _ := os.ReadDir(hubModel)
	for _, e := range entries {
		files[e.Name()], _ = os.ReadFile(filepath.Join(hubModel, e.Name()))
	}
	hub := hubserver.Start(t, hubserver.Repo{Name: "Qwen/Qwen2.5-0.5B-Instruct", Files: files, CardData: map[string]any{"license": "apache-2.0"}})
	// The promoted copy keeps its signature (the tour's copy -r line): verify it as the driver would.
	script += "\nmodelpack verify localhost" + port + "/prod/llama3:8b --key cosign.pub --insecure-ignore-tlog\n"
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"), "MODELPACK_HOME="+filepath.Join(work, "home"),
		"DOCKER_CONFIG="+filepath.Join(work, "docker"), "HF_ENDPOINT="+hub.URL, "HF_TOKEN=", "HF_HOME="+filepath.Join(work, "hf"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the README tour failed: %v\n%s", err, out)
	}
	for _, want := range []string{"packed llama3:8b", "packed qwen2.5:0.5b", "Pushed localhost" + port + "/models/qwen2.5:0.5b", "Pushed localhost" + port + "/models/llama3:8b", "Signed ", "\n8b\n", "Verified localhost" + port + "/models/llama3@sha256:", "Verified localhost" + port + "/prod/llama3@sha256:"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the tour's output lacks %q:\n%s", want, out)
		}
	}
	for _, f := range []string{"out/config.json", "weights/" + testmodel.ShardName(0, 2), "cosign.key", "cosign.pub"} {
		if _, err := os.Stat(filepath.Join(work, f)); err != nil {
			t.Errorf("after the tour: %v", err)
		}
	}
}
