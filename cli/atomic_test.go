package cli

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// snapshotDir is every entry under dir: type, mode and content, to compare a directory before and after a run.
func snapshotDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		v := fi.Mode().String()
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			v += fmt.Sprintf(" %x", sha256.Sum256(b))
		}
		out[rel] = v
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return out
}

// Issue 32 item 2: a model with identical files in one directory unpacks and fetches (each digest written once,
// the others copied), and an unpack or fetch that fails (a corrupt blob) leaves the destination exactly as it was:
// a directory it would have created does not exist, files already there (with --force, files it would replace)
// are untouched, and nothing of the model lands (fetch keeps no download aside: running again cannot help).
func TestUnpackFetchIdenticalFilesAllOrNothing(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{AccessLog: true})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	model := filepath.Join(t.TempDir(), "model")
	os.MkdirAll(filepath.Join(model, "shards"), 0o755)
	weights := bytes.Repeat([]byte("identical weights "), 200<<10) // 3.5 MiB
	for i := range 4 {
		os.WriteFile(filepath.Join(model, "shards", fmt.Sprintf("model-%d.safetensors", i)), weights, 0o644)
	}
	os.WriteFile(filepath.Join(model, "config.json"), []byte(`{"model_type":"dup"}`), 0o644)
	os.WriteFile(filepath.Join(model, "README.md"), []byte("# dup\n"), 0o644)
	home := t.TempDir()
	ref := reg.Host + "/org/dup:v1"
	mustRemoteCLI(t, "--home", home, "pack", model, "-t", ref, "--push", "--plain-http", "-q")
	mustRemoteCLI(t, "--home", home, "pack", model, "-t", "local/dup:v1", "-q")
	unpack := func(dir string, extra ...string) []string {
		return append([]string{"--home", home, "unpack", "local/dup:v1", dir}, extra...)
	}
	fetch := func(dir string, extra ...string) []string {
		return append([]string{"fetch", "--plain-http", ref, dir}, extra...)
	}
	for name, args := range map[string]func(string, ...string) []string{"unpack": unpack, "fetch": fetch} {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			logBefore, _ := os.ReadFile(reg.LogPath)
			mustRemoteCLI(t, args(out, "-q")...)
			if name == "fetch" {
				// One download of the four identical files.
				log, _ := os.ReadFile(reg.LogPath)
				sum := sha256.Sum256(weights)
				gets := 0
				for _, line := range strings.Split(string(log[len(logBefore):]), "\n") {
					if strings.Contains(line, fmt.Sprintf("GET /v2/org/dup/blobs/sha256:%x", sum)) && (strings.Contains(line, `" 200 `) || strings.Contains(line, `" 206 `)) {
						gets++
					}
				}
				if gets != 1 {
					t.Errorf("the shared weight blob was downloaded %d times", gets)
				}
			}
			for i := range 4 {
				b, err := os.ReadFile(filepath.Join(out, "shards", fmt.Sprintf("model-%d.safetensors", i)))
				if err != nil || !bytes.Equal(b, weights) {
					t.Fatalf("shard %d: %d bytes, %v", i, len(b), err)
				}
			}
			if left := snapshotDir(t, out); len(left) != 8 { // ., config.json, README.md, shards, 4 shards
				t.Fatalf("left in the destination: %v", left)
			}
		})
	}

	// Corrupt the shared weight blob, same size, in the local store and in the registry.
	sum := sha256.Sum256(weights)
	hexSum := fmt.Sprintf("%x", sum)
	corrupt := func(p string) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0xff
		os.Chmod(p, 0o644)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	corrupt(reg.BlobPath("sha256:" + hexSum))
	found := false
	filepath.WalkDir(home, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && d.Name() == hexSum {
			corrupt(p)
			found = true
		}
		return nil
	})
	if !found {
		t.Fatal("the weight blob is not in the local store")
	}

	for name, args := range map[string]func(string, ...string) []string{"unpack": unpack, "fetch": fetch} {
		t.Run(name+" fails", func(t *testing.T) {
			// A destination that does not exist yet stays absent.
			fresh := filepath.Join(t.TempDir(), "new", "out")
			if _, err := runRemoteCLI(t, "", args(fresh)...); err == nil {
				t.Fatal("a corrupt blob was unpacked")
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(fresh))); !os.IsNotExist(err) {
				t.Fatalf("the failed run left %s: %v", filepath.Dir(fresh), snapshotDir(t, filepath.Dir(fresh)))
			}
			// A destination with files of its own, one of which --force would replace, is as it was.
			dir := filepath.Join(t.TempDir(), "out")
			os.MkdirAll(filepath.Join(dir, "shards"), 0o755)
			os.WriteFile(filepath.Join(dir, "mine.txt"), []byte("mine"), 0o600)
			os.WriteFile(filepath.Join(dir, "README.md"), []byte("old readme"), 0o644)
			before := snapshotDir(t, dir)
			_, err := runRemoteCLI(t, "", args(dir, "--force")...)
			if err == nil || !strings.Contains(err.Error(), "model-0.safetensors") {
				t.Fatalf("over a corrupt blob: %v", err)
			}
			after := snapshotDir(t, dir)
			if fmt.Sprint(before) != fmt.Sprint(after) {
				t.Fatalf("the failed %s changed the destination:\nbefore %v\nafter  %v", name, before, after)
			}
		})
	}
}
