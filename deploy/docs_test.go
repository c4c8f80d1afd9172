package deploy_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// docCommand is one shell command of README.md or deploy/README.md as written: a line of a ```sh block or of an
// indented block, with its continuation lines joined and trailing comments dropped.
type docCommand struct {
	file, section, text string
}

// docFiles are the documents whose shell commands this test holds to account: the READMEs and the user's guides
// under docs/ that the README links.
var docFiles = []string{"README.md", "deploy/README.md", "docs/usage.md", "docs/operations.md", "docs/security.md",
	"docs/design.md", "docs/benchmarks.md", "docs/testing.md"}

// docCommands lists every shell command of docFiles.
func docCommands(t *testing.T) []docCommand {
	t.Helper()
	var out []docCommand
	for _, name := range docFiles {
		b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), name))
		if err != nil {
			t.Fatal(err)
		}
		section, fence, prevBlank := "", "", true
		var pending string
		var add func(line string)
		add = func(line string) {
			if m := alternative.FindStringSubmatch(line); m != nil {
				add(m[1]) // "CMD  # or: OTHER" documents OTHER too
			}
			line = trailingComment.ReplaceAllString(line, "")
			line = strings.TrimSpace(line)
			if strings.HasPrefix(line, "#") || (line == "" && pending == "") {
				return
			}
			if cont, ok := strings.CutSuffix(line, "\\"); ok {
				pending += strings.TrimSpace(cont) + " "
				return
			}
			out = append(out, docCommand{file: name, section: section, text: strings.TrimSpace(pending + line)})
			pending = ""
		}
		indented := false
		for _, l := range strings.Split(string(b), "\n") {
			switch {
			case fence != "":
				if strings.HasPrefix(l, "```") {
					fence = ""
				} else if fence == "sh" {
					add(l)
				}
			case strings.HasPrefix(l, "```"):
				fence = strings.TrimPrefix(l, "```")
				if fence == "" {
					fence = "text"
				}
			case strings.HasPrefix(l, "    ") && (prevBlank || indented):
				indented = true
				add(l)
			default:
				indented = false
				if strings.HasPrefix(l, "#") {
					section = strings.TrimSpace(strings.TrimLeft(l, "#"))
				}
			}
			prevBlank = strings.TrimSpace(l) == ""
		}
	}
	return out
}

var (
	trailingComment = regexp.MustCompile(`\s+#\s.*$`)
	alternative     = regexp.MustCompile(`\s#\s+or:\s+(.*)$`)
)

// offline stands in for the cluster: kubectl apply/delete -k render the kustomization they would send, kubectl
// apply -f reads the manifest, helm install/upgrade render the release with the same arguments. Everything else
// they are given is an error, so a documented command of another shape cannot pass unnoticed.
const offline = `
kubectl() {
  case "$1 $2" in
    "apply -k"|"delete -k") kustomize build "$3" ;;
    "apply -f") cat "$3" ;;
    *) echo "offline kubectl cannot run: kubectl $*" >&2; return 1 ;;
  esac
}
helm() {
  case "$1" in
    install|upgrade) shift; command helm template "$@" ;;
    *) echo "offline helm cannot run: helm $*" >&2; return 1 ;;
  esac
}
`

// notRunnable are the documented commands this test cannot run, each with why and what covers it instead.
var notRunnable = []struct{ pattern, why string }{
	{`^make demo$`, "the demo itself (root, a registry, the driver, minutes); e2e/demo.sh is what it runs"},
	{`^make test$`, "the whole suite, this test included"},
	{`^BENCH_ONLY=\S+ BENCH_BASELINE_BIN=\S+ go run \./internal/cmd/bench$`, "a benchmark (minutes, needs an older binary); internal/bench's tests check its arithmetic"},
	{`^(BENCH_ONLY=cluster make bench|((BENCH_MODEL_SIZE|BENCH_PARTS|BENCH_COLD_RUNS)=\S+ )*go run -tags cluster \./e2e/cluster/bench)$`, "the pod-start benchmark: its own real cluster, minutes; go vet -tags cluster builds it in make test"},
	{`^kubectl create namespace modelpack$`, "changes a live cluster; the cluster suite (e2e/cluster) deploys into the modelpack namespace"},
	{`^kubectl label namespace modelpack pod-security\.kubernetes\.io/enforce=privileged$`, "changes a live cluster; deploy/base/namespace.yaml, which the overlays apply, carries the same label"},
	{`^kubectl -n modelpack create secret generic modelpack-keys --from-file=cosign\.pub$`, "changes a live cluster; e2e/cluster's TestTrustPolicy creates modelpack-keys the same way (kubectl create secret generic --from-file=cosign.pub=…)"},
	{`^kubectl -n modelpack edit configmap modelpack-prepull$`, "interactive, on a live cluster; e2e/cluster's TestPrepull applies an edited modelpack-prepull ConfigMap"},
	{`^helm uninstall modelpack -n modelpack$`, "needs an installed release on a live cluster"},
}

// Every shell command of docFiles either runs here, as written, or is listed in notRunnable
// with the reason. The README's tour runs in cli's TestReadmeTourRunsAsWritten; kubectl and helm commands run
// offline (kustomize build, helm template) and their output must decode strictly into Kubernetes types; a helm
// flag fragment runs as `helm template` of the chart with those flags. A new command that is neither fails here.
func TestDocCommandsRunOrAreListed(t *testing.T) {
	root := testenv.RepoRoot()
	tools := filepath.Dir(testenv.Tool(t, "kustomize")) + string(os.PathListSeparator) + filepath.Dir(testenv.Tool(t, "helm"))
	used := make([]bool, len(notRunnable))
	ran := 0
	for _, c := range docCommands(t) {
		if c.file == "README.md" && c.section == "A short tour" {
			continue // TestReadmeTourRunsAsWritten (cli) runs this block with the built binary against a registry
		}
		listed := false
		for i, n := range notRunnable {
			if regexp.MustCompile(n.pattern).MatchString(c.text) {
				used[i], listed = true, true
			}
		}
		if listed {
			continue
		}
		script := c.text
		if strings.HasPrefix(script, "--set ") {
			// A fragment of flags for the helm install above it.
			script = "helm install modelpack deploy/helm/modelpack -n modelpack " + script
		}
		if !strings.HasPrefix(script, "kubectl ") && !strings.HasPrefix(script, "helm ") {
			t.Errorf("%s (%s): %q is neither run by this test nor listed as not runnable here (notRunnable)", c.file, c.section, c.text)
			continue
		}
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", offline+script)
		cmd.Dir = root
		home := t.TempDir()
		cmd.Env = append(os.Environ(), "PATH="+tools+string(os.PathListSeparator)+os.Getenv("PATH"), "HOME="+home,
			"HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Errorf("%s (%s): %q failed: %v\n%s", c.file, c.section, c.text, err, stderr.String())
			continue
		}
		decode(t, c.file+": "+c.text, out)
		t.Logf("ran %s: %s", c.file, c.text)
		ran++
	}
	for i, u := range used {
		if !u {
			t.Errorf("notRunnable lists %q, which no README command matches any more: drop it", notRunnable[i].pattern)
		}
	}
	if ran == 0 {
		t.Fatal("no documented command ran")
	}
	t.Logf("%d documented commands ran offline", ran)
}
