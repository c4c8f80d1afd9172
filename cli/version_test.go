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
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
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

// Item 32.9: `go install github.com/modelpack/modelpack/cli/modelpack@VERSION` works and the binary says VERSION.
// The module at VERSION is served from a file:// module proxy made of a clean copy of this checkout (HEAD plus
// its uncommitted changes), as proxy.golang.org would serve a tag; dependencies come from the module cache.
func TestGoInstallAtVersion(t *testing.T) {
	root := testenv.RepoRoot()
	src, proxy, gobin := t.TempDir(), t.TempDir(), t.TempDir()
	// git archive: the committed tree only, no .git and nothing untracked (bin/, caches), as a tag's zip is.
	if out, err := exec.Command("sh", "-c", `git -C "$1" archive HEAD | tar -x -C "$2"`, "sh", root, src).CombinedOutput(); err != nil {
		t.Fatalf("git archive: %v\n%s", err, out)
	}
	if diff, err := exec.Command("git", "-C", root, "diff", "--binary", "HEAD").Output(); err != nil {
		t.Fatal(err)
	} else if len(diff) > 0 {
		apply := exec.Command("git", "apply", "-")
		apply.Dir, apply.Stdin = src, bytes.NewReader(diff)
		if out, err := apply.CombinedOutput(); err != nil {
			t.Fatalf("git apply: %v\n%s", err, out)
		}
	}
	const version = "v0.1.0"
	dir := filepath.Join(proxy, "github.com", "modelpack", "modelpack", "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	if err := modzip.CreateFromDir(f, module.Version{Path: "github.com/modelpack/modelpack", Version: version}, src); err != nil {
		t.Fatalf("module zip: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		version + ".mod":  gomod,
		version + ".info": []byte(`{"Version":"` + version + `","Time":"2026-12-01T00:00:00Z"}`),
		"list":            []byte(version + "\n"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	install := exec.Command("go", "install", "github.com/modelpack/modelpack/cli/modelpack@"+version)
	install.Dir = t.TempDir() // outside any module, as a user runs it
	// This module from the file proxy, every dependency from the module cache; no checksum database here (there is
	// no network), so dependencies are checked against the module's own go.sum only.
	install.Env = append(os.Environ(), "GOBIN="+gobin, "GOPROXY=file://"+proxy, "GOSUMDB=off", "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install …@%s: %v\n%s", version, err, out)
	}
	out, err := exec.Command(filepath.Join(gobin, "modelpack"), "version", "-o", "json").Output()
	if err != nil {
		t.Fatalf("version: %v", err)
	}
	var v struct{ Version string }
	if err := json.Unmarshal(out, &v); err != nil || v.Version != version {
		t.Errorf("go install …@%s says version %q (%v): %s", version, v.Version, err, out)
	}
	if text, err := exec.Command(filepath.Join(gobin, "modelpack"), "version").Output(); err != nil || !strings.HasPrefix(string(text), "modelpack "+version+" ") {
		t.Errorf("version: %v %q", err, text)
	}
}
