package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Item: unpack and fetch refuse to overwrite, before writing anything; --force replaces files.
func TestUnpackAndFetchRefuseToOverwrite(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	model := smallModel(t)
	home := t.TempDir()
	ref := reg.Host + "/org/overwrite:v1"
	mustRemoteCLI(t, "--home", home, "pack", model, "-t", ref, "--push", "--plain-http", "-q")
	mustRemoteCLI(t, "--home", home, "pack", model, "-t", "local/overwrite:v1", "-q")

	for _, c := range []struct {
		name string
		args func(dir string) []string
	}{
		{"unpack", func(dir string) []string { return []string{"--home", home, "unpack", "local/overwrite:v1", dir} }},
		{"fetch", func(dir string) []string { return []string{"fetch", "--plain-http", ref, dir} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "out")
			out := mustRemoteCLI(t, append(c.args(dir), "-o", "json")...)
			var res struct {
				Reference  string `json:"reference"`
				Descriptor struct {
					ArtifactType string `json:"artifactType"`
				} `json:"descriptor"`
				Files []string `json:"files"`
			}
			if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Files) == 0 || res.Descriptor.ArtifactType != "application/vnd.cncf.model.manifest.v1+json" {
				t.Fatalf("%s -o json: %v: %s", c.name, err, out)
			}
			cfg := filepath.Join(dir, "config.json")
			os.WriteFile(cfg, []byte("edited"), 0o444)
			_, err := runRemoteCLI(t, "", c.args(dir)...)
			if err == nil || !strings.Contains(err.Error(), "config.json") || !strings.Contains(err.Error(), "--force") {
				t.Fatalf("%s over existing files: %v", c.name, err)
			}
			if b, _ := os.ReadFile(cfg); string(b) != "edited" {
				t.Fatal("the refused command replaced config.json")
			}
			if _, err := runRemoteCLI(t, "", append(c.args(dir), "--keep-old-files")...); err == nil {
				t.Fatal("--keep-old-files replaced files")
			}
			if _, err := runRemoteCLI(t, "", append(c.args(dir), "--keep-old-files", "--force")...); err == nil {
				t.Fatal("--force with --keep-old-files accepted")
			}
			// A directory where a file goes: refused even with --force, and the other files stay as they are.
			os.Remove(cfg)
			os.MkdirAll(filepath.Join(cfg, "sub"), 0o755)
			readme := filepath.Join(dir, "README.md")
			os.WriteFile(readme, []byte("mine"), 0o644)
			_, err = runRemoteCLI(t, "", append(c.args(dir), "--force")...)
			if err == nil || !strings.Contains(err.Error(), "config.json is a directory where a file goes") {
				t.Fatalf("%s --force over a directory: %v", c.name, err)
			}
			if b, _ := os.ReadFile(readme); string(b) != "mine" {
				t.Fatal("a refused --force replaced README.md")
			}
			os.RemoveAll(cfg)
			mustRemoteCLI(t, append(c.args(dir), "--force", "-q")...)
			want, _ := os.ReadFile(filepath.Join(model, "README.md"))
			if b, _ := os.ReadFile(readme); string(b) != string(want) {
				t.Fatal("--force did not replace README.md")
			}
		})
	}
}

// Item: unpack and fetch follow one rule, run through the binary: run again, they skip the files already there
// byte for byte and succeed; a file that differs is refused (named, --force offered) and left as it was.
func TestRerunSkipsIdenticalFiles(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	docker := t.TempDir()
	run := binaryRunner(t, "DOCKER_CONFIG="+docker)
	model := smallModel(t)
	home := t.TempDir()
	ref := reg.Host + "/org/rerun:v1"
	for _, args := range [][]string{
		{"--home", home, "pack", model, "-t", ref, "--push", "--plain-http", "-q"},
		{"--home", home, "pack", model, "-t", "local/rerun:v1", "-q"},
	} {
		if code, _, stderr := run(args...); code != 0 {
			t.Fatalf("%v: %s", args, stderr)
		}
	}
	for name, args := range map[string]func(dir string) []string{
		"unpack": func(dir string) []string { return []string{"--home", home, "unpack", "local/rerun:v1", dir} },
		"fetch":  func(dir string) []string { return []string{"fetch", "--plain-http", ref, dir} },
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "out")
			for i := range 2 {
				if code, _, stderr := run(args(dir)...); code != 0 {
					t.Fatalf("%s run %d into %s: exit %d: %s", name, i+1, dir, code, stderr)
				}
			}
			cfg := filepath.Join(dir, "config.json")
			os.WriteFile(cfg, []byte("edited"), 0o644)
			code, _, stderr := run(args(dir)...)
			if code == 0 || !strings.Contains(stderr, "config.json") || !strings.Contains(stderr, "--force") || strings.Contains(stderr, "README.md") {
				t.Fatalf("%s over one edited file: exit %d: %s", name, code, stderr)
			}
			if b, _ := os.ReadFile(cfg); string(b) != "edited" {
				t.Fatal("the refused command replaced config.json")
			}
		})
	}
}
