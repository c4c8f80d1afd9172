package cli

import (
	"bytes"
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

// Item: a plain go build (or go install …@VERSION), without make's -ldflags, still says which commit it is and a
// version Go derived from it, not "dev".
func TestVersionOfPlainGoBuild(t *testing.T) {
	root := testenv.RepoRoot()
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		testenv.Unavailable(t, "git rev-parse: %v", err)
	}
	rev := strings.TrimSpace(string(head))
	// Go stamps VCS facts only where .git is a directory (not in a git worktree, where it is a file), so build
	// in a clone of HEAD, as a user's go build in their clone does, with this checkout's uncommitted changes on top.
	src, bin := t.TempDir(), filepath.Join(t.TempDir(), "modelpack")
	git := func(dir string, stdin []byte, args ...string) []byte {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		cmd.Stdin = bytes.NewReader(stdin)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %s: %v", strings.Join(args, " "), err)
		}
		return out
	}
	git(root, nil, "clone", "-q", "--shared", root, src)
	if diff := git(root, nil, "diff", "--binary", "HEAD"); len(diff) > 0 {
		git(src, diff, "apply", "-")
	}
	build := exec.Command("go", "build", "-o", bin, "./cli/modelpack")
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=auto") // a user's default, whatever this machine's go env says
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version", "-o", "json").Output()
	if err != nil {
		t.Fatalf("version -o json: %v", err)
	}
	var v struct{ Version, Revision string }
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("version -o json: %v: %s", err, out)
	}
	if v.Revision != rev {
		t.Errorf("revision %q, HEAD is %s", v.Revision, rev)
	}
	// Go's pseudo-version names the commit by its first 12 hex digits (v0.0.0-20261203…-fcbb64e1a2b3).
	if v.Version == "dev" || v.Version == "" || !strings.Contains(v.Version, rev[:12]) {
		t.Errorf("version %q for a go build at %s", v.Version, rev)
	}
	text, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.Contains(string(text), rev[:12]) || strings.Contains(string(text), "modelpack dev") {
		t.Errorf("version: %v %q", err, text)
	}
}
