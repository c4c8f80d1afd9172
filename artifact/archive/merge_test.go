package archive

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// listTree lists everything under dir with its type, mode and content.
func listTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, _ := d.Info()
		rel, _ := filepath.Rel(dir, p)
		v := fi.Mode().String()
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			v += " " + string(b)
		}
		out[rel] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A merge that fails at any rename leaves the destination exactly as it was, and the staged tree whole, so
// nothing is half moved: what was replaced comes back, what came in goes back, changed directory modes revert.
func TestMergeIntoUndoesOnFailure(t *testing.T) {
	setup := func(t *testing.T) (dst, src string) {
		dst = t.TempDir()
		src = filepath.Join(dst, ".stage")
		for p, c := range map[string]string{
			"x": "old x", "d/y": "old y", "keep": "mine", "f/inner": "a directory where a file goes",
			".stage/x": "new x", ".stage/d/y": "new y", ".stage/d/z": "new z", ".stage/w/v": "new v", ".stage/f": "file",
		} {
			os.MkdirAll(filepath.Join(dst, filepath.Dir(p)), 0o755)
			os.WriteFile(filepath.Join(dst, p), []byte(c), 0o644)
		}
		os.Chmod(filepath.Join(src, "d"), 0o750)
		return dst, src
	}
	// Count the renames of a whole merge, then fail at each one in turn.
	dst, src := setup(t)
	renames := 0
	mergeHook = func(string) error { renames++; return nil }
	if _, err := MergeInto(src, dst); err != nil {
		t.Fatal(err)
	}
	mergeHook = nil
	t.Cleanup(func() { mergeHook = nil })
	if renames < 4 {
		t.Fatalf("only %d renames", renames)
	}
	for fail := 1; fail <= renames; fail++ {
		t.Run(fmt.Sprint("fail at rename ", fail), func(t *testing.T) {
			dst, src := setup(t)
			before := listTree(t, dst)
			n := 0
			boom := errors.New("boom")
			mergeHook = func(string) error {
				if n++; n == fail {
					return boom
				}
				return nil
			}
			if _, err := MergeInto(src, dst); !errors.Is(err, boom) {
				t.Fatalf("got %v", err)
			}
			if after := listTree(t, dst); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("not undone:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}
