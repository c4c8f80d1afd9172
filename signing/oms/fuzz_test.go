package oms

import (
	"path/filepath"
	"testing"
)

// FuzzParse: any bytes parse or are refused without panicking, and what parses keeps the statement's invariants
// (one spelling per digest, names inside the model, a root digest over the resources).
func FuzzParse(f *testing.F) {
	for _, vc := range allVectors {
		f.Add(read(f, filepath.Join(vectors, vc.dir, SignatureFile)))
	}
	f.Add([]byte(`{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","dsseEnvelope":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data)
		if err != nil {
			return
		}
		again, err := ParseStatement(s.Payload())
		if err != nil {
			t.Fatalf("a parsed signature's statement does not parse again: %v", err)
		}
		for _, r := range again.Resources {
			if err := checkName(r.Name, again.Serialization.Method); err != nil {
				t.Fatal(err)
			}
		}
		if err := again.Check(Files{}); len(again.Resources) > 0 && err == nil {
			t.Fatal("an empty model matched a statement with resources")
		}
	})
}

// FuzzParseStatement: statements alone, including shard names.
func FuzzParseStatement(f *testing.F) {
	f.Add([]byte(`{"_type":"https://in-toto.io/Statement/v1","subject":[{"name":"m","digest":{"sha256":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}}],"predicateType":"https://model_signing/signature/v1.0","predicate":{"serialization":{"method":"shards","hash_type":"sha256","shard_size":10,"allow_symlinks":false},"resources":[]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := ParseStatement(data)
		if err != nil {
			return
		}
		if _, err := st.JSON(); err != nil {
			t.Fatal(err)
		}
	})
}
