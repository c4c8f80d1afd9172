package signing

import (
	"os"
	"path/filepath"
	"testing"
)

// The policy file is operator input: any document either loads into a policy that picks a rule for every
// repository, or is refused with an error; it never panics.
func FuzzLoadPolicy(f *testing.F) {
	f.Add([]byte("default: {mode: enforce, none: true}\n"))
	f.Add([]byte("default: {mode: warn, none: true}\nrules:\n- name: a\n  match: [\"r.example/**\"]\n  mode: off\n  none: true\n"))
	f.Add([]byte("default: {mode: enforcing}\n"))
	f.Add([]byte("rules: [{match: ['[']}]\n"))
	f.Add([]byte("default: {none: true}\nrules:\n- name: a\n  namespaces: [prod, 'team-*']\n  match: [\"r.example/**\"]\n  mode: off\n"))
	f.Fuzz(func(t *testing.T, doc []byte) {
		p := filepath.Join(t.TempDir(), "policy.yaml")
		if err := os.WriteFile(p, doc, 0o644); err != nil {
			t.Fatal(err)
		}
		pol, err := LoadPolicy(p)
		if err != nil {
			return
		}
		for _, repo := range []string{"r.example/models/a", "index.docker.io/library/x", ""} {
			r := pol.ruleIn("team-a", repo)
			if r == nil || pol.ruleFor(repo) == nil {
				t.Fatalf("no rule for %q", repo)
			}
			switch r.mode {
			case Enforce, Warn, Off:
			default:
				t.Fatalf("rule %q has mode %q", r.name, r.mode)
			}
		}
	})
}
