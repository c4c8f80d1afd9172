package cli

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Item: the built binary says its version and the commit it was built from, and the version is the image tag the
// Makefile, the Helm chart and the kustomize base deploy.
func TestVersionIsStampedAndAgrees(t *testing.T) {
	run := binaryRunner(t)
	code, out, stderr := run("version", "-o", "json")
	var v struct {
		Version, Revision, Go string
	}
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil {
		t.Fatalf("version -o json: exit %d %v: %s%s", code, err, out, stderr)
	}
	root := testenv.RepoRoot()
	read := func(rel string, re string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(re).FindSubmatch(b)
		if m == nil {
			t.Fatalf("%s: no match for %s", rel, re)
		}
		return string(m[1])
	}
	want := map[string]string{
		"Makefile VERSION":          read("Makefile", `(?m)^VERSION := (\S+)`),
		"Chart.yaml appVersion":     read("deploy/helm/modelpack/Chart.yaml", `(?m)^appVersion: "?([^"\s]+)`),
		"values.yaml image.tag":     read("deploy/helm/modelpack/values.yaml", `(?m)^  tag: "?([^"\s]+)`),
		"deploy/base newTag":        read("deploy/base/kustomization.yaml", `(?m)newTag: "?([^"\s]+)`),
		"modelpack version -o json": v.Version,
	}
	for k, got := range want {
		if got != want["Makefile VERSION"] {
			t.Errorf("%s is %q, the Makefile's VERSION %q", k, got, want["Makefile VERSION"])
		}
	}
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		testenv.Unavailable(t, "git rev-parse: %v", err)
	}
	if v.Revision != strings.TrimSpace(string(head)) {
		t.Errorf("version -o json says revision %q, the checkout is at %s (rebuild with make build)", v.Revision, head)
	}
	if code, out, _ := run("version"); code != 0 || !strings.Contains(out, v.Version) || !strings.Contains(out, v.Revision[:min(12, len(v.Revision))]) {
		t.Errorf("version: %q", out)
	}
}
