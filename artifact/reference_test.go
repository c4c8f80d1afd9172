package artifact

import (
	"errors"
	"testing"
)

func TestRefuseCredentials(t *testing.T) {
	dgst := "sha256:" + "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"
	for ref, refused := range map[string]bool{
		"user:hunter2@registry.example/m:v1":   true,
		"user@registry.example/m:v1":           true,
		"https://user:pw@registry.example/m":   true,
		"user:pw@registry.example":             true,
		"registry.example/m@" + dgst:           false,
		"registry.example/m:v1":                false,
		"llama3@" + dgst:                       false,
		"llama3:8b":                            false,
		"localhost:5000/a/b:v1@" + dgst:        false,
		"registry.example/m:pw@registry.other": false, // a tag cannot hold "@": the parser refuses it
		"hf://Qwen@main":                       false, // an organisation and a revision: a usage error of its own
		"hf://user:tok@Qwen":                   true,
		"hf://tok@Qwen/Qwen2.5":                true,
		"hf://Qwen/Qwen2.5@main":               false,
	} {
		if got := errors.Is(RefuseCredentials(ref), ErrCredentialsInReference); got != refused {
			t.Errorf("%s: refused %v, want %v", ref, got, refused)
		}
	}
}
