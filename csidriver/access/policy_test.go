package access

import (
	"strconv"
	"strings"
	"testing"
)

func TestPolicyAllows(t *testing.T) {
	node := Identity{Kind: Node}
	prepulled := []Record{{Identity: Identity{Kind: Prepull}}}
	for _, tc := range []struct {
		name  string
		mode  Mode
		allow []string
		recs  []Record
		who   Identity
		want  bool
	}{
		{"no record: ask the registry, whatever the mode", NeverVerify, nil, nil, alice, false},
		{"no record under AlwaysVerify", AlwaysVerify, nil, nil, node, false},
		{"NeverVerify shares what the name served", NeverVerify, nil, []Record{{Identity: alice}}, node, true},
		{"own credential", AlwaysVerify, nil, []Record{{Identity: alice}}, alice, true},
		{"another tenant's credential", NeverVerifyPreloadedImages, nil, []Record{{Identity: alice}}, bob, false},
		{"no credential against a secret's record", NeverVerifyPreloadedImages, nil, []Record{{Identity: alice}}, node, false},
		{"a rotated credential", NeverVerifyPreloadedImages, nil, []Record{{Identity: alice}}, Identity{Kind: Secret, Hash: "a2", Namespace: "team-a"}, false},
		{"public content", AlwaysVerify, nil, []Record{{Identity: Identity{Kind: Anonymous}}}, bob, true},
		// The node's credentials vouch for the node's own reads: the mode says whether pods share them, as it
		// does for prepulls.
		{"read with the node's credentials, AlwaysVerify", AlwaysVerify, nil, []Record{{Identity: Identity{Kind: Node}}}, bob, false},
		{"read with the node's credentials, default mode", NeverVerifyPreloadedImages, nil, []Record{{Identity: Identity{Kind: Node}}}, bob, true},
		{"read with the node's credentials, not allowlisted", NeverVerifyAllowlistedImages, []string{"registry.example.com/other/*"}, []Record{{Identity: Identity{Kind: Node}}}, bob, false},
		{"read with the node's credentials, NeverVerify", NeverVerify, nil, []Record{{Identity: Identity{Kind: Node}}}, bob, true},
		{"a wrong secret gets no more than none", AlwaysVerify, nil, []Record{{Identity: alice}, {Identity: Identity{Kind: Prepull}}}, Identity{Kind: Secret, Hash: "wrong"}, false},
		{"prepulled, default mode", NeverVerifyPreloadedImages, nil, prepulled, node, true},
		{"prepulled, AlwaysVerify", AlwaysVerify, nil, prepulled, alice, false},
		{"prepulled, allowlisted by prefix", NeverVerifyAllowlistedImages, []string{"registry.example.com/models/*"}, prepulled, node, true},
		{"prepulled, allowlisted exactly", NeverVerifyAllowlistedImages, []string{"registry.example.com/models/llama"}, prepulled, node, true},
		{"prepulled, not allowlisted", NeverVerifyAllowlistedImages, []string{"registry.example.com/other/*"}, prepulled, node, false},
		{"prefix matches at a component boundary only", NeverVerifyAllowlistedImages, []string{"registry.example.com/mod/*"}, prepulled, node, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPolicy(string(tc.mode), tc.allow)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Allows(key, tc.recs, tc.who); got != tc.want {
				t.Fatalf("Allows = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNewPolicyValidates(t *testing.T) {
	if p, err := NewPolicy("", nil); err != nil || p.Mode != NeverVerifyPreloadedImages {
		t.Fatalf("default: %+v %v, want kubelet 1.36's NeverVerifyPreloadedImages", p, err)
	}
	for _, tc := range []struct {
		mode  string
		allow []string
		want  string
	}{
		{"Sometimes", nil, "NeverVerify, NeverVerifyPreloadedImages, NeverVerifyAllowlistedImages, AlwaysVerify"},
		{"AlwaysVerify", []string{"registry.example.com/models/*"}, "only read with NeverVerifyAllowlistedImages"},
		{"NeverVerifyAllowlistedImages", []string{"models/*"}, "not a registry host"},
		{"NeverVerifyAllowlistedImages", []string{"registry.example.com/models:v1"}, "lower-case"},
		{"NeverVerifyAllowlistedImages", []string{"registry.example.com/models@sha256:00"}, "no tag, digest"},
		{"NeverVerifyAllowlistedImages", []string{"registry.example.com/*/x"}, "no tag, digest or inner wildcard"},
		{"NeverVerifyAllowlistedImages", []string{"registry.example.com//x"}, "empty path component"},
		{"NeverVerifyAllowlistedImages", []string{"registry.example.com"}, "repository path is missing"},
	} {
		_, err := NewPolicy(tc.mode, tc.allow)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewPolicy(%q, %q) = %v, want an error with %q", tc.mode, tc.allow, err, tc.want)
		}
	}
	for _, ok := range []string{"registry.example.com/*", "localhost:5000/models/llama", "10.0.0.1:5000/a/b/*"} {
		if _, err := NewPolicy("NeverVerifyAllowlistedImages", []string{ok}); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
}

// FuzzNewPolicy: any allowlist entry is accepted or refused with a message naming it, never a panic; an accepted
// pattern matches the names under it and nothing that merely shares a prefix.
func FuzzNewPolicy(f *testing.F) {
	for _, s := range []string{"registry.example.com/models/*", "localhost:5000/a", "x/*", "a.b//", "*", "a.b/c@d", "h:1/p:q"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, pat string) {
		p, err := NewPolicy(string(NeverVerifyAllowlistedImages), []string{pat})
		if err != nil {
			if !strings.Contains(err.Error(), strconv.Quote(pat)) {
				t.Fatalf("error %q does not name the entry", err)
			}
			return
		}
		base := strings.TrimSuffix(pat, "/*")
		if strings.HasSuffix(pat, "/*") {
			if !p.allowlisted(base+"/x") || p.allowlisted(base+"x/y") {
				t.Fatalf("%q matches wrongly", pat)
			}
		} else if !p.allowlisted(pat) || p.allowlisted(pat+"x") {
			t.Fatalf("%q matches wrongly", pat)
		}
	})
}
