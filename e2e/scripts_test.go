package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Under `set -e` a check written as `cmd && echo ok` passes when cmd fails (a failing && list does not stop the
// script), so the demo and the benchmarks must write checks as `cmd || fail …`.
func TestScriptChecksCanFail(t *testing.T) {
	scripts, err := filepath.Glob("*.sh")
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts found: %v", err)
	}
	reportsSuccess := regexp.MustCompile(`&&\s*(echo|printf)\b`)
	for _, s := range scripts {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			code := strings.TrimSpace(line)
			if strings.HasPrefix(code, "#") || strings.HasPrefix(code, "if ") || strings.HasPrefix(code, "while ") {
				continue
			}
			if reportsSuccess.MatchString(code) {
				t.Errorf("%s:%d: %q reports success with && under set -e; write `cmd || fail …` then the message", s, i+1, code)
			}
		}
	}
}

// The first `make demo` builds only what the demo runs (the registry and modelpack), not the seven pinned tools
// `make test` needs; `make test` keeps building all of them. Read from make's dry run, everything forced (-B).
func TestDemoBuildsOnlyWhatItRuns(t *testing.T) {
	installs := func(target string) []string {
		t.Helper()
		cmd := exec.Command("make", "-n", "-B", target)
		cmd.Dir = testenv.RepoRoot()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("make -n -B %s: %v", target, err)
		}
		var tools []string
		for _, l := range strings.Split(string(out), "\n") {
			if i := strings.Index(l, "go install "); i >= 0 {
				f := strings.Fields(l[i+len("go install "):])
				tools = append(tools, f[0][strings.LastIndex(f[0], "/")+1:])
			}
		}
		return tools
	}
	if got := installs("demo"); len(got) != 1 || !strings.HasPrefix(got[0], "registry@") {
		t.Errorf("make demo installs %v, want the registry only", got)
	}
	uniq := map[string]bool{}
	for _, tool := range installs("test") {
		uniq[tool] = true
	}
	if got := installs("test"); len(uniq) != 7 {
		t.Errorf("make test installs %v, want all seven pinned tools", got)
	}
}
