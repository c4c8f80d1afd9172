package csidriver

import (
	"path/filepath"
	"strings"
	"testing"
)

// Volume attributes come from any pod author: whatever is accepted must be a usable reference, a known pull
// policy and a sub-path that stays inside the model.
func FuzzParseAttributes(f *testing.F) {
	f.Add("registry.example.com/models/llama:v1", "IfNotPresent", "tokenizer", "weights,config", "*.json", "linux/amd64")
	f.Add("r/m@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "", "../etc", "", "", "")
	f.Add("127.0.0.1:5000/a", "Always", "/abs", "docs", "[", "linux")
	f.Fuzz(func(t *testing.T, ref, policy, sub, filter, include, platform string) {
		ctx := map[string]string{AttrReference: ref}
		for k, v := range map[string]string{AttrPullPolicy: policy, AttrSubPath: sub, AttrFilter: filter, AttrInclude: include, AttrPlatform: platform} {
			if v != "" {
				ctx[k] = v
			}
		}
		a, err := ParseAttributes(ctx)
		if err != nil {
			if _, ok := err.(*AttributeError); !ok {
				t.Fatalf("error %T is not an *AttributeError: %v", err, err)
			}
			return
		}
		switch a.PullPolicy {
		case PullAlways, PullIfNotPresent, PullNever:
		default:
			t.Fatalf("accepted pull policy %q", a.PullPolicy)
		}
		if a.SubPath != "" && (filepath.IsAbs(a.SubPath) || a.SubPath == ".." || strings.HasPrefix(a.SubPath, "../")) {
			t.Fatalf("accepted sub-path %q that leaves the model", a.SubPath)
		}
		if _, err := ParseReference(a.Reference); err != nil {
			t.Fatalf("accepted reference %q does not parse again: %v", a.Reference, err)
		}
	})
}
