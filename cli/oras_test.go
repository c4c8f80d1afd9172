package cli

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// Item: with --layer-format tar*, the real oras CLI pulls every file as it was packed: single files stay raw,
// and tar+gzip directories carry oras's unpack annotation.
func TestLayerFormatsPullWithOras(t *testing.T) {
	oras := testenv.Tool(t, "oras")
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	model := t.TempDir()
	if err := testmodel.Generate(model, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"LICENSE": "Apache-2.0\n", "docs/guide.md": "# guide\n", "docs/img/a.txt": "a\n"} {
		p := filepath.Join(model, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(body), 0o644)
	}
	var files []string
	filepath.WalkDir(model, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			r, _ := filepath.Rel(model, p)
			files = append(files, r)
		}
		return nil
	})
	for _, format := range []string{"tar", "tar+gzip", "tar+zstd"} {
		t.Run(format, func(t *testing.T) {
			ref := reg.Host + "/oras/" + map[string]string{"tar": "t", "tar+gzip": "tgz", "tar+zstd": "tzst"}[format] + ":v1"
			mustRemoteCLI(t, "pack", model, "-t", ref, "--layer-format", format, "--push", "--plain-http", "-q")
			out := t.TempDir()
			cmd := exec.Command(oras, "pull", "--plain-http", "-o", out, ref)
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("oras pull: %v\n%s", err, b)
			}
			for _, f := range files {
				want, _ := os.ReadFile(filepath.Join(model, f))
				got, err := os.ReadFile(filepath.Join(out, f))
				if filepath.Dir(f) != "." && format != "tar+gzip" {
					continue // oras unpacks only tar+gzip directories; the others arrive as archives named after the directory
				}
				if err != nil || !bytes.Equal(got, want) {
					t.Errorf("oras pull of --layer-format %s: %s differs (%v)", format, f, err)
				}
			}
		})
	}
}
