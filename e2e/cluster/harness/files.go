package harness

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// SumScript is a shell fragment that prints `sha256sum` lines for every file under dir, between markers, so a
// pod's log can be checked with ParseSums.
func SumScript(dir string) string {
	return "echo '--- sums'; find " + dir + " -type f -exec sha256sum {} +; echo '--- end'"
}

// ParseSums reads SumScript's output from a log: path relative to dir → hex sha256.
func ParseSums(t testing.TB, log, dir string) map[string]string {
	t.Helper()
	_, rest, ok := strings.Cut(log, "--- sums\n")
	if !ok {
		t.Fatalf("no sums in log:\n%s", log)
	}
	body, _, ok := strings.Cut(rest, "--- end")
	if !ok {
		t.Fatalf("sums cut short in log:\n%s", log)
	}
	sums := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
		sum, path, ok := strings.Cut(line, "  ")
		if !ok {
			continue
		}
		sums[strings.TrimPrefix(path, strings.TrimSuffix(dir, "/")+"/")] = sum
	}
	return sums
}

// TreeSums is the sha256 of every regular file under dir, by relative path.
func TreeSums(t testing.TB, dir string) map[string]string {
	t.Helper()
	sums := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		sums[rel] = hex.EncodeToString(h.Sum(nil))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sums
}
