package scan

import (
	"io/fs"
	"os"
	"path/filepath"
)

// FileReport is one file's report with its path in the model.
type FileReport struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	Report
}

// Refused reports whether any file is code or malformed.
func Refused(files []FileReport) bool {
	for _, f := range files {
		if f.Verdict != Data {
			return true
		}
	}
	return false
}

// Dir scans every regular file under root (or root itself, a file), in lexical order, with paths relative to root. A symbolic link to a
// regular file is scanned as that file (the Hugging Face cache's snapshots are links into its blobs); any other
// link is malformed, as nothing can say what a loader would find there.
func (l Limits) Dir(root string) ([]FileReport, error) {
	var out []FileReport
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." { // root is a file
			rel = filepath.Base(p)
		}
		rel = filepath.ToSlash(rel)
		switch {
		case d.IsDir():
			return nil
		case d.Type()&fs.ModeSymlink != 0:
			if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
				out = append(out, FileReport{Path: rel, Report: malformedReport("symlink", "a symbolic link to no regular file")})
				return nil
			}
		case !d.Type().IsRegular():
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		out = append(out, FileReport{Path: rel, Size: st.Size(), Report: l.File(f, st.Size())})
		return nil
	})
	return out, err
}

// Dir scans a directory with DefaultLimits.
func Dir(root string) ([]FileReport, error) { return DefaultLimits.Dir(root) }
