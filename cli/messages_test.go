package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testenv/hubserver"
)

// Item: --include matches nested files as Hugging Face's --include does ('*.json' keeps onnx/config.json), in
// unpack and fetch alike, and a glob that keeps nothing is said, not met with an empty directory and silence.
func TestIncludeMatchesNestedFiles(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir())
	model := smallModel(t)
	os.MkdirAll(filepath.Join(model, "onnx"), 0o755)
	os.WriteFile(filepath.Join(model, "onnx", "config.json"), []byte("{}\n"), 0o644)
	os.WriteFile(filepath.Join(model, "onnx", "model.onnx"), []byte("weights"), 0o644)
	home := t.TempDir()
	ref := reg.Host + "/org/include:v1"
	for _, args := range [][]string{{"pack", model, "-t", ref, "--push", "--plain-http", "-q"}, {"pack", model, "-t", "local/include:v1", "-q"}} {
		if code, _, stderr := run(append([]string{"--home", home}, args...)...); code != 0 {
			t.Fatal(stderr)
		}
	}
	for name, args := range map[string]func(dir string) []string{
		"unpack": func(dir string) []string { return []string{"--home", home, "unpack", "local/include:v1", dir} },
		"fetch":  func(dir string) []string { return []string{"fetch", "--plain-http", ref, dir} },
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "out")
			if code, _, stderr := run(append(args(dir), "--include", "*.json")...); code != 0 {
				t.Fatal(stderr)
			}
			for _, f := range []string{"config.json", "onnx/config.json"} {
				if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
					t.Errorf("--include '*.json' did not write %s", f)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "onnx", "model.onnx")); err == nil {
				t.Error("--include '*.json' wrote onnx/model.onnx")
			}
			code, _, stderr := run(append(args(filepath.Join(t.TempDir(), "none")), "--include", "*.gguf")...)
			if code != 0 || !strings.Contains(stderr, `--include "*.gguf" matches no file`) {
				t.Errorf("a glob that keeps nothing: exit %d, stderr %q", code, stderr)
			}
			// --strict fails instead, before writing anything, naming the glob; the globs that match are fine.
			strict := filepath.Join(t.TempDir(), "strict")
			code, _, stderr = run(append(args(strict), "--include", "*.json", "--include", "*.gguf", "--strict")...)
			if code != 1 || !strings.Contains(stderr, `--include "*.gguf": matches no file`) || !strings.Contains(stderr, "nothing was written") {
				t.Errorf("--strict with a glob that keeps nothing: exit %d, stderr %q", code, stderr)
			}
			if entries, _ := os.ReadDir(strict); len(entries) > 0 {
				t.Errorf("--strict refused but wrote %d entries", len(entries))
			}
			if code, _, stderr := run(append(args(filepath.Join(t.TempDir(), "ok")), "--include", "*.json", "--strict")...); code != 0 {
				t.Errorf("--strict with globs that match: %s", stderr)
			}
		})
	}
}

// Item: messages that say what to write instead: a URL scheme, upper case in a repository, logout with nothing to
// remove.
func TestMessagesSayWhatToDo(t *testing.T) {
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir())
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"pull", "http://localhost:5000/org/m:v1"}, "write localhost:5000/org/m:v1 and add --plain-http"},
		{[]string{"fetch", "https://r.example/org/m:v1", t.TempDir()}, "a reference has no scheme: write r.example/org/m:v1"},
		{[]string{"tags", "localhost:5000/Org/Model"}, "repository names are lowercase: write localhost:5000/org/model"},
		{[]string{"pull", "localhost:5000/Org/Model:V1"}, "write localhost:5000/org/model:V1"},
	} {
		code, _, stderr := run(c.args...)
		if code != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, want %q in %q", c.args, code, c.want, stderr)
		}
	}
	// --plain-http against a TLS registry: it answers 400 Bad Request, which says nothing by itself.
	_, cert, key := testenv.WriteCA(t)
	tlsReg := testenv.StartRegistry(t, testenv.RegistryOptions{CertFile: cert, KeyFile: key})
	for _, args := range [][]string{{"pull", tlsReg.Host + "/org/m:v1", "--plain-http"}, {"tags", tlsReg.Host + "/org/m", "--plain-http"}} {
		code, _, stderr := run(args...)
		if code != 1 || !strings.Contains(stderr, "the registry speaks HTTPS, not plain HTTP: drop --plain-http") || strings.Contains(stderr, "Error:  ") {
			t.Errorf("%v: exit %d %q", args, code, stderr)
		}
	}
	cfg := filepath.Join(t.TempDir(), "config.json")
	if code, out, stderr := run("logout", "registry.example:5000", "--registry-config", cfg); code != 0 || !strings.Contains(out, "Not logged in to registry.example:5000") {
		t.Errorf("logout with no credentials: exit %d %q %q", code, out, stderr)
	}
}

// Item: pack warns of a --kind/--dataset rule, or an hf:// --include/--exclude glob, that matches nothing, and
// --strict fails instead before anything is packed.
func TestPackStrictUnmatched(t *testing.T) {
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir())
	model := smallModel(t)
	home := t.TempDir()
	code, _, stderr := run("--home", home, "pack", model, "-t", "local/strict:v1", "--dataset", "data/**", "-q")
	if code != 0 || !strings.Contains(stderr, `"data/**" matches nothing`) {
		t.Errorf("a rule that matches nothing: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = run("--home", home, "pack", model, "-t", "local/strict:v2", "--dataset", "data/**", "--strict", "-q")
	if code != 1 || !strings.Contains(stderr, `"data/**" matches nothing; nothing was packed (strict)`) {
		t.Errorf("--strict: exit %d, stderr %q", code, stderr)
	}
	if code, out, _ := run("--home", home, "list"); code != 0 || strings.Contains(out, "strict:v2") {
		t.Errorf("--strict refused but tagged strict:v2: %s", out)
	}

	repo, _ := hubRepo(t, "acme/strict")
	hubEnv(t, hubserver.Start(t, repo))
	code, _, stderr = run("--home", home, "pack", "hf://acme/strict", "-t", "local/strict:hf", "--include", "*.gguf", "--include", "*.json", "-q")
	if code != 0 || !strings.Contains(stderr, `--include "*.gguf" matches no file of hf://acme/strict`) {
		t.Errorf("hf:// --include that matches nothing: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = run("--home", home, "pack", "hf://acme/strict", "-t", "local/strict:hf2", "--exclude", "*.bin", "--strict", "-q")
	if code != 1 || !strings.Contains(stderr, `--exclude "*.bin" matches no file of hf://acme/strict`) || !strings.Contains(stderr, "nothing was packed (strict)") {
		t.Errorf("hf:// --strict: exit %d, stderr %q", code, stderr)
	}
}
