package pack

import (
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/format/gitignore"

	"github.com/modelpack/modelpack/artifact"
)

// IgnoreFileName is the ignore file Pack reads from the model directory unless told otherwise.
const IgnoreFileName = ".modelpackignore"

// ignoreFile is a parsed ignore file: .gitignore's syntax and meaning (go-git's matcher), patterns relative to
// the model directory.
type ignoreFile struct {
	name    string // as the user knows it, for messages
	matcher gitignore.Matcher
}

// ignores reports whether rel, a file, is ignored: as in git, a file under an ignored directory stays ignored
// whatever a later "!" line says.
func (ig *ignoreFile) ignores(rel string) bool {
	if ig == nil {
		return false
	}
	parts := strings.Split(rel, "/")
	for i := 1; i < len(parts); i++ {
		if ig.matcher.Match(parts[:i], true) {
			return true
		}
	}
	return ig.matcher.Match(parts, false)
}

// parseIgnore reads an ignore file's patterns as git does: blank lines and "#" comments skipped.
func parseIgnore(r io.Reader, name string) (*ignoreFile, error) {
	b, err := io.ReadAll(io.LimitReader(r, 1<<20+1))
	if err != nil {
		return nil, badInput(name, "cannot read ignore file: %v", unwrapPathError(err))
	}
	if len(b) > 1<<20 {
		return nil, badInput(name, "ignore file over 1 MiB")
	}
	var ps []gitignore.Pattern
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSuffix(line, "\r")
		if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
			continue
		}
		ps = append(ps, gitignore.ParsePattern(line, nil))
	}
	return &ignoreFile{name: name, matcher: gitignore.NewMatcher(ps)}, nil
}

// loadIgnore reads the ignore file the options name, or DIR/.modelpackignore if present (read from the tree, as
// the model's files are); none with Options.NoIgnoreFile. It returns the model-relative path of an ignore file
// inside dir, which is not packed.
func loadIgnore(t *tree, dir string, opts Options) (*ignoreFile, string, error) {
	if opts.NoIgnoreFile {
		return nil, "", nil
	}
	name := opts.IgnoreFile
	var f io.ReadCloser
	var err error
	if name == "" {
		name = filepath.Join(dir, IgnoreFileName)
		f, err = t.root.Open(path.Join(t.prefix, IgnoreFileName))
		if errors.Is(err, os.ErrNotExist) {
			return nil, "", nil
		}
	} else {
		f, err = os.Open(name)
	}
	if err != nil {
		return nil, "", badInput(name, "cannot read ignore file: %v", unwrapPathError(err))
	}
	defer f.Close()
	ig, err := parseIgnore(f, name)
	if err != nil {
		return nil, "", err
	}
	return ig, relInside(dir, name), nil
}

// relInside is name's model-relative path when it lies inside dir, else "".
func relInside(dir, name string) string {
	absDir, err1 := filepath.Abs(dir)
	absName, err2 := filepath.Abs(name)
	if err1 != nil || err2 != nil {
		return ""
	}
	if r, err := filepath.Rel(absDir, absName); err == nil && filepath.IsLocal(r) {
		return filepath.ToSlash(r)
	}
	return ""
}

// Keeps returns what Pack asks of each file of the directory dir: kept by opts' ignore file, Include and Exclude.
// It is for a caller that reads the directory itself before a pack (the code scan), so that it judges the files
// Pack packs and no others. A dir that is a lone file, or cannot be opened, keeps by Include and Exclude alone
// (Pack reports what is wrong with it).
func Keeps(dir string, opts Options) func(rel string) bool {
	var ig *ignoreFile
	if t, err := openTree(dir); err == nil {
		ig, _, _ = loadIgnore(t, dir, opts) // an unreadable ignore file is Pack's to report
		t.Close()
	}
	return func(rel string) bool {
		return !ig.ignores(rel) && (len(opts.Include) == 0 || artifact.MatchInclude(opts.Include, rel)) && !artifact.MatchInclude(opts.Exclude, rel)
	}
}
