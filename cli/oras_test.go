package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// Item: with every --layer-format, the real oras CLI pulls a model with nested layouts (a sub-directory holding
// weights and other files, as ONNX exports and diffusers pipelines do) into a tree diff -r equal to the source.
// Single files stay raw; tar+gzip directories carry oras's unpack annotation, so raw and tar+gzip need nothing
// after oras pull. oras's file store extracts gzip only (oras-go 2.7 opens the blob with gzip.NewReader whatever
// the annotations say), so tar and tar+zstd directories arrive as NAME.tar / NAME.tar.zst beside the directory
// their weights create, which `tar -xf` unpacks in place.
func TestLayerFormatsPullWithOras(t *testing.T) {
	oras := testenv.Tool(t, "oras")
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	docker := t.TempDir()
	run := binaryRunner(t, "DOCKER_CONFIG="+docker)
	model := t.TempDir()
	if err := testmodel.Generate(model, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"LICENSE": "Apache-2.0\n", "docs/guide.md": "# guide\n", "docs/img/a.txt": "a\n",
		"onnx/model.onnx": "onnx weights", "onnx/config.json": "{}\n",
		"text_encoder/config.json": `{"a":1}`, "text_encoder/onnx/model.onnx": "encoder weights", "text_encoder/tokenizer/vocab.txt": "x y\n",
	} {
		p := filepath.Join(model, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(body), 0o644)
	}
	for _, format := range []string{"raw", "tar", "tar+gzip", "tar+zstd"} {
		t.Run(format, func(t *testing.T) {
			ref := reg.Host + "/oras/" + strings.ReplaceAll(format, "+", "-") + ":v1"
			if code, _, stderr := run("pack", model, "-t", ref, "--layer-format", format, "--push", "--plain-http", "-q"); code != 0 {
				t.Fatalf("pack: %s", stderr)
			}
			out := t.TempDir()
			cmd := exec.Command(oras, "pull", "--plain-http", "-o", out, ref)
			cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+docker)
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("oras pull of --layer-format %s: %v\n%s", format, err, b)
			}
			archives, _ := filepath.Glob(filepath.Join(out, "*.tar*"))
			if (format == "tar" || format == "tar+zstd") != (len(archives) > 0) {
				t.Fatalf("--layer-format %s: archives %v", format, archives)
			}
			for _, a := range archives {
				if b, err := exec.Command("tar", "-xf", a, "-C", out).CombinedOutput(); err != nil {
					t.Fatalf("tar -xf %s: %v %s", a, err, b)
				}
				os.Remove(a)
			}
			if b, err := exec.Command("diff", "-r", model, out).CombinedOutput(); err != nil {
				t.Fatalf("oras pull of --layer-format %s differs from the source: %v\n%s", format, err, b)
			}
		})
	}
}
