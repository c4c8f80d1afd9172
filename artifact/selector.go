package artifact

import (
	"fmt"
	"path"
	"slices"
	"strings"
)

// ValidateGlob checks an include glob: a non-empty relative path, path.Match syntax per component.
func ValidateGlob(g string) error {
	if g == "" || strings.HasPrefix(g, "/") {
		return fmt.Errorf("include glob %q must be a non-empty relative path", g)
	}
	for _, part := range strings.Split(g, "/") {
		if _, err := path.Match(part, ""); err != nil {
			return fmt.Errorf("include glob %q: %w", g, err)
		}
	}
	return nil
}

// MatchInclude reports whether the model-relative path p is kept by one of globs: the glob matches p or one of its
// parent directories (a directory kept keeps everything under it). Components match with path.Match syntax and
// "**" matches any number of them ("**/*.json", "tokenizer/**"). A glob without a "/" matches a name at any depth,
// as .gitignore and Hugging Face's `--include '*.json'` do (onnx/config.json too).
func MatchInclude(globs []string, p string) bool {
	parts := strings.Split(p, "/")
	for _, g := range globs {
		gp := globParts(g)
		for n := 1; n <= len(parts); n++ {
			if matchGlob(gp, parts[:n]) {
				return true
			}
		}
	}
	return false
}

// MatchGlob reports whether glob, in MatchInclude's syntax, matches the model-relative path p itself (not only a
// parent directory of p): what pack --kind asks of each file and directory.
func MatchGlob(glob, p string) bool {
	return matchGlob(globParts(glob), strings.Split(p, "/"))
}

// globParts splits a glob into components; one without a "/" matches a name at any depth.
func globParts(g string) []string {
	gp := strings.Split(g, "/")
	if !strings.Contains(g, "/") {
		gp = append([]string{"**"}, gp...)
	}
	return gp
}

// UnmatchedGlobs returns the globs that keep none of paths, so a caller can say so instead of writing nothing.
func UnmatchedGlobs(globs, paths []string) []string {
	var out []string
	for _, g := range globs {
		if !slices.ContainsFunc(paths, func(p string) bool { return MatchInclude([]string{g}, p) }) {
			out = append(out, g)
		}
	}
	return out
}

// matchGlob matches path components against glob components, "**" spanning any number of them.
func matchGlob(g, p []string) bool {
	for len(g) > 0 {
		if g[0] == "**" {
			for i := 0; i <= len(p); i++ {
				if matchGlob(g[1:], p[i:]) {
					return true
				}
			}
			return false
		}
		if len(p) == 0 {
			return false
		}
		if ok, _ := path.Match(g[0], p[0]); !ok {
			return false
		}
		g, p = g[1:], p[1:]
	}
	return len(p) == 0
}
