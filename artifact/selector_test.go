package artifact

import (
	"strings"
	"testing"
)

func TestMatchInclude(t *testing.T) {
	for _, c := range []struct {
		glob, path string
		want       bool
	}{
		{"*.json", "config.json", true},
		{"*.json", "onnx/config.json", true}, // as Hugging Face's --include
		{"onnx/*.json", "onnx/config.json", true},
		{"onnx/*.json", "text_encoder/onnx/config.json", false},
		{"**/onnx/*.json", "text_encoder/onnx/config.json", true},
		{"tokenizer/**", "tokenizer/a/b.txt", true},
		{"docs", "docs/img/a.png", true}, // a directory keeps what is under it
		{"model-00001-*", "model-00001-of-00002.safetensors", true},
		{"model-00001-*", "model-00002-of-00002.safetensors", false},
		{"*.safetensors", "config.json", false},
	} {
		if got := MatchInclude([]string{c.glob}, c.path); got != c.want {
			t.Errorf("MatchInclude(%q, %q) = %v, want %v", c.glob, c.path, got, c.want)
		}
	}
	if got := UnmatchedGlobs([]string{"*.json", "*.gguf"}, []string{"a/config.json"}); len(got) != 1 || got[0] != "*.gguf" {
		t.Errorf("UnmatchedGlobs: %v", got)
	}
}

func FuzzMatchInclude(f *testing.F) {
	f.Add("**/*.json", "a/b/c.json")
	f.Add("[", "x")
	f.Fuzz(func(t *testing.T, g, p string) {
		if len(g) > 64 || strings.Count(g, "**") > 4 {
			return // "**" backtracks: bound the search, as ValidateGlob's callers bound their input
		}
		if ValidateGlob(g) != nil {
			return
		}
		MatchInclude([]string{g}, p)
	})
}
