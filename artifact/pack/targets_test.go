package pack_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelpack/modelpack/artifact/pack"
)

// snapshot maps every file under dir to its content, to show that a refused unpack changed nothing.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			files[p] = string(b)
		}
		return nil
	})
	return files
}

func TestUnpackRefusesExistingPathsBeforeWriting(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	src := sampleModel(t)
	m, _ := readManifest(t, s, packInto(t, s, src, pack.Options{}))
	out := filepath.Join(t.TempDir(), "out")
	files, err := pack.Unpack(ctx, s, m, out, pack.UnpackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 || files[0] > files[len(files)-1] {
		t.Fatalf("files written: %v", files)
	}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatalf("listed file %s: %v", f, err)
		}
	}
	// Files get the mtime the artifact records (the epoch for a reproducible pack), as fetch gives them.
	fi, _ := os.Stat(filepath.Join(out, "config.json"))
	if !fi.ModTime().Equal(time.Unix(0, 0)) {
		t.Fatalf("config.json mtime %v, want the recorded epoch", fi.ModTime())
	}

	// A rerun over an untouched unpack writes nothing and succeeds: every file is already there, byte for byte.
	if again, err := pack.Unpack(ctx, s, m, out, pack.UnpackOptions{}); err != nil || strings.Join(again, ",") != strings.Join(files, ",") {
		t.Fatalf("rerun over identical files: %v %v", err, again)
	}

	// A local edit, a changed read-only file: a second unpack refuses, names them, and writes nothing.
	os.WriteFile(filepath.Join(out, "config.json"), []byte("mine"), 0o644)
	os.Chmod(filepath.Join(out, "README.md"), 0o644)
	os.WriteFile(filepath.Join(out, "README.md"), []byte("mine"), 0o444)
	os.Chmod(filepath.Join(out, "README.md"), 0o444)
	before := snapshot(t, out)
	_, err = pack.Unpack(ctx, s, m, out, pack.UnpackOptions{})
	var ee *pack.ExistsError
	if !errors.As(err, &ee) || !strings.Contains(err.Error(), "config.json") || !strings.Contains(err.Error(), "README.md (read-only)") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("second unpack: %v", err)
	}
	if after := snapshot(t, out); len(after) != len(before) || after[filepath.Join(out, "config.json")] != "mine" {
		t.Fatal("a refused unpack changed the directory")
	}

	// A directory where a file goes is refused even with Force, before any file is replaced.
	os.Remove(filepath.Join(out, "config.json"))
	os.MkdirAll(filepath.Join(out, "config.json", "x"), 0o755)
	before = snapshot(t, out)
	_, err = pack.Unpack(ctx, s, m, out, pack.UnpackOptions{Force: true})
	if !errors.As(err, &ee) || len(ee.Blocking) != 1 || !strings.Contains(err.Error(), "config.json is a directory where a file goes") {
		t.Fatalf("unpack over a directory: %v", err)
	}
	for p, c := range snapshot(t, out) {
		if before[p] != c {
			t.Fatalf("%s changed although the unpack was refused", p)
		}
	}

	// With Force, existing files (the read-only one too) are replaced by the artifact's.
	os.RemoveAll(filepath.Join(out, "config.json"))
	os.WriteFile(filepath.Join(out, "config.json"), []byte("mine"), 0o444)
	if _, err := pack.Unpack(ctx, s, m, out, pack.UnpackOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(filepath.Join(src, "config.json"))
	if got, _ := os.ReadFile(filepath.Join(out, "config.json")); string(got) != string(want) {
		t.Fatal("--force did not replace config.json")
	}
}
