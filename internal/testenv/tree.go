package testenv

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// Tree lists what is under dir as sorted lines, to compare a tree with another or with what a test expects:
// "PATH dir PERM", "PATH symlink TARGET" and "PATH file PERM CONTENT", CONTENT being what content makes of the
// file's bytes (the bytes themselves for small fixtures, a digest for models). PERM is octal.
func Tree(t testing.TB, dir string, content func([]byte) string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out = append(out, rel+" symlink "+target)
		case d.IsDir():
			out = append(out, fmt.Sprintf("%s dir %o", rel, info.Mode().Perm()))
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out = append(out, fmt.Sprintf("%s file %o %s", rel, info.Mode().Perm(), content(b)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}
