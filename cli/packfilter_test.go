package cli

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Item (issue 32.6): packing a directory takes --include/--exclude (unpack --include's globs), packs only what
// they keep, does not warn of (or refuse) a pickle they leave out, and a choice that keeps nothing is a usage
// error before anything is stored.
func TestPackDirectoryIncludeExclude(t *testing.T) {
	run := binaryRunner(t)
	model := smallModel(t)
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "scan", "testdata", "vectors", "evil_torch.pt"))
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(model, "extra", "deep"), 0o755)
	os.WriteFile(filepath.Join(model, "extra", "deep", "pytorch_model.bin"), b, 0o644)
	os.WriteFile(filepath.Join(model, "extra", "notes.txt"), []byte("n\n"), 0o644)
	home := t.TempDir()

	code, _, errOut := run("--home", home, "pack", model, "-t", "m:v1", "--exclude", "extra/deep", "--refuse-code")
	if code != 0 || strings.Contains(errOut, "pytorch_model.bin") {
		t.Fatalf("pack --exclude extra/deep --refuse-code: exit %d\n%s", code, errOut)
	}
	_, m, _ := stored(t, home, "m:v1")
	paths := slices.Sorted(func(yield func(string) bool) {
		for p := range layerDigests(m) {
			if !yield(p) {
				return
			}
		}
	})
	if slices.Contains(paths, "extra/deep/pytorch_model.bin") || !slices.Contains(paths, "extra/notes.txt") {
		t.Errorf("--exclude extra/deep packed %q", paths)
	}

	code, _, errOut = run("--home", home, "pack", model, "-t", "m:json", "--include", "*.json")
	if code != 0 {
		t.Fatalf("pack --include '*.json': exit %d\n%s", code, errOut)
	}
	_, m, _ = stored(t, home, "m:json")
	for p := range layerDigests(m) {
		if !strings.HasSuffix(p, ".json") {
			t.Errorf("--include '*.json' packed %s", p)
		}
	}
	if len(layerDigests(m)) == 0 {
		t.Error("--include '*.json' packed nothing")
	}

	code, _, errOut = run("--home", home, "pack", model, "-t", "m:none", "--include", "*.nothing")
	if code == 0 || !strings.Contains(errOut, "leave no file to pack") {
		t.Fatalf("pack --include '*.nothing': exit %d\n%s", code, errOut)
	}
	if code, _, errOut = run("--home", home, "pack", model, "-t", "m:abs", "--include", "/etc"); code != 2 {
		t.Fatalf("pack --include /etc: exit %d, want 2\n%s", code, errOut)
	}
}
