package cache

import (
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/artifact"
)

func TestSelectorMatch(t *testing.T) {
	cases := []struct {
		globs []string
		path  string
		want  bool
	}{
		{nil, "anything/at/all", true},
		{[]string{"*.safetensors"}, "model-00001.safetensors", true},
		{[]string{"*.safetensors"}, "sub/model.safetensors", true}, // no "/": any depth, as the CLI's --include
		{[]string{"**/*.safetensors"}, "sub/deep/model.safetensors", true},
		{[]string{"**/*.safetensors"}, "model.safetensors", true},
		{[]string{"tokenizer/**"}, "tokenizer/vocab.json", true},
		{[]string{"tokenizer"}, "tokenizer/vocab.json", true}, // a matching directory keeps its contents
		{[]string{"tokenizer"}, "tokenizer.json", false},
		{[]string{"a/*/c"}, "a/b/c", true},
		{[]string{"a/*/c"}, "a/b/x/c", false},
		{[]string{"x", "config.json"}, "config.json", true},
	}
	for _, c := range cases {
		if got := (Selector{Include: c.globs}).file(c.path); got != c.want {
			t.Errorf("%v on %q = %v, want %v", c.globs, c.path, got, c.want)
		}
	}
	m := digest.FromString("m")
	a := Selector{Kinds: []artifact.Kind{artifact.KindDoc, artifact.KindWeight, artifact.KindDoc}, Include: []string{"b", "a"}}
	b := Selector{Kinds: []artifact.Kind{artifact.KindWeight, artifact.KindDoc}, Include: []string{"a", "b", "a"}}
	if viewKey(m, a) != viewKey(m, b) || viewKey(m, a) == viewKey(m, Selector{}) || viewKey(m, Selector{}) != m.Encoded() {
		t.Error("equal selectors must share a view, and differ from the whole view")
	}
	for _, bad := range []Selector{{Kinds: []artifact.Kind{"weights"}}, {Include: []string{"/abs"}}, {Include: []string{""}}, {Include: []string{"a/[x"}}} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
