package pack

import (
	"bytes"
	"testing"

	"github.com/modelpack/modelpack/artifact"
)

// A Modelfile comes from the model's author: whatever parses yields rules of known kinds with patterns.
func FuzzParseModelfile(f *testing.F) {
	f.Add([]byte("NAME llama\nARCH transformer\nMODEL *.safetensors\nDATASET data/\n# comment\n"))
	f.Add([]byte("CONFIG ../x\nDOC /abs\n"))
	f.Add([]byte("FAMILY\nMODEL [\n"))
	f.Fuzz(func(t *testing.T, doc []byte) {
		mf, err := ParseModelfile(bytes.NewReader(doc), "Modelfile")
		if err != nil {
			return
		}
		for _, r := range mf.Rules {
			if _, err := artifact.ParseKind(string(r.Kind)); err != nil {
				t.Fatalf("rule %+v has an unknown kind", r)
			}
			if r.Pattern == "" {
				t.Fatalf("rule %+v has no pattern", r)
			}
		}
	})
}
