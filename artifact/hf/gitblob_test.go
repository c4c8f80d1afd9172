package hf

import (
	"encoding/hex"
	"testing"
)

func gitBlobID(b []byte) string {
	h := newGitBlobHash(int64(len(b)))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// The ids git gives these contents (git hash-object).
func TestGitBlobID(t *testing.T) {
	for content, want := range map[string]string{
		"{}": "9e26dfeeb6e641a33dae4961196235bdb965b21b",
		"":   "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391",
	} {
		if got := gitBlobID([]byte(content)); got != want {
			t.Errorf("%q: %s, want %s", content, got, want)
		}
	}
}
