package cli

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Item: `tags` of a repository the registry does not know says so in one line, without the registry's detail dump.
func TestTagsOfMissingRepositoryOneLine(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir())
	code, _, stderr := run("tags", "--plain-http", reg.Host+"/nope/model")
	want := "Error: repository " + reg.Host + "/nope/model not found\n"
	if code == 0 || stderr != want {
		t.Fatalf("exit %d, stderr %q, want %q", code, stderr, want)
	}
}

// Item: credentials given with -u/-p that the registry rejects are named as such; suggesting `modelpack login`
// would not help, since -u/-p take its place. Without -u/-p the login hint stays.
func TestRejectedExplicitCredentialsNoLoginHint(t *testing.T) {
	hash, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: "ann:" + string(hash) + "\n"})
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir())
	code, _, stderr := run("tags", "--plain-http", "-u", "ann", "-p", "wrong", reg.Host+"/a/model")
	if code == 0 || strings.Contains(stderr, "modelpack login") || !strings.Contains(stderr, "check -u/--username and -p/--password") {
		t.Fatalf("wrong -u/-p: exit %d: %s", code, stderr)
	}
	code, _, stderr = run("copy", "--plain-http", "--from-username", "ann", "--from-password", "wrong", reg.Host+"/a/model:v1", reg.Host+"/b/model:v1")
	if code == 0 || strings.Contains(stderr, "modelpack login") || !strings.Contains(stderr, "check --from-username and --from-password") {
		t.Fatalf("wrong --from-username/--from-password: exit %d: %s", code, stderr)
	}
	code, _, stderr = run("tags", "--plain-http", reg.Host+"/a/model")
	if code == 0 || !strings.Contains(stderr, "modelpack login "+reg.Host) {
		t.Fatalf("no credentials: exit %d: %s", code, stderr)
	}
}

// Item: `pack model.gguf` (a lone file, as oras and ollama take one) packs an artifact of that one file as a
// weight layer, for GGUF and safetensors alike; pushed and pulled through a registry it unpacks to the same bytes.
func TestPackSingleFile(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir())
	gguf := append([]byte("GGUF\x03\x00\x00\x00"), make([]byte, 16)...) // v3, no tensors, no metadata
	hdr := `{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	st := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	st = append(append(st, hdr...), 1, 2, 3, 4, 5, 6, 7, 8)
	for name, body := range map[string][]byte{"model.gguf": gguf, "model.safetensors": st} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "other.txt"), []byte("not the model's"), 0o644)
			f := filepath.Join(dir, name)
			if err := os.WriteFile(f, body, 0o644); err != nil {
				t.Fatal(err)
			}
			home := t.TempDir()
			ref := reg.Host + "/single/" + strings.TrimPrefix(filepath.Ext(name), ".") + ":v1"
			if code, _, stderr := run("--home", home, "pack", f, "-t", ref); code != 0 {
				t.Fatalf("pack %s: exit %d: %s", f, code, stderr)
			}
			code, out, stderr := run("--home", home, "inspect", ref, "-o", "json")
			if code != 0 {
				t.Fatalf("inspect: exit %d: %s", code, stderr)
			}
			var doc struct {
				Manifest struct {
					Layers []struct {
						MediaType   string            `json:"mediaType"`
						Size        int64             `json:"size"`
						Annotations map[string]string `json:"annotations"`
					} `json:"layers"`
				} `json:"manifest"`
			}
			err := json.Unmarshal([]byte(out), &doc)
			m := doc.Manifest
			if err != nil {
				t.Fatalf("inspect -o json: %v: %s", err, out)
			}
			if len(m.Layers) != 1 || m.Layers[0].MediaType != "application/vnd.cncf.model.weight.v1.raw" ||
				m.Layers[0].Annotations["org.opencontainers.image.title"] != name || m.Layers[0].Size != int64(len(body)) {
				t.Fatalf("want one weight layer titled %s of %d bytes: %s", name, len(body), out)
			}
			if code, _, stderr := run("--home", home, "push", "--plain-http", ref); code != 0 {
				t.Fatalf("push: exit %d: %s", code, stderr)
			}
			dst := filepath.Join(t.TempDir(), "out")
			home2 := t.TempDir()
			if code, _, stderr := run("--home", home2, "pull", "--plain-http", ref); code != 0 {
				t.Fatalf("pull: exit %d: %s", code, stderr)
			}
			if code, _, stderr := run("--home", home2, "unpack", ref, dst); code != 0 {
				t.Fatalf("unpack: exit %d: %s", code, stderr)
			}
			got, err := os.ReadFile(filepath.Join(dst, name))
			if err != nil || !bytes.Equal(got, body) {
				t.Fatalf("pulled %s: %v, %d bytes, want the %d packed", name, err, len(got), len(body))
			}
			if entries, _ := os.ReadDir(dst); len(entries) != 1 {
				t.Fatalf("pulled %d files, want only %s: %v", len(entries), name, entries)
			}
		})
	}
}
