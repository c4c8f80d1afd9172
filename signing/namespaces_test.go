package signing

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/scan"
)

func loadDoc(t *testing.T, doc string) (*Policy, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return LoadPolicy(p)
}

// A rule scoped to namespaces governs a reference only for pods in them, and before any unscoped rule whatever
// the order; within each pass the first matching rule wins; a caller with no namespace sees unscoped rules only.
func TestNamespaceScopedRules(t *testing.T) {
	p, err := loadDoc(t, `default: {mode: off}
rules:
- name: everyone
  match: ["r.example/models/**"]
  none: true
- name: prod
  namespaces: [prod, "payments-*"]
  match: ["r.example/models/**"]
  mode: off
- name: prod-later
  namespaces: [prod]
  match: ["r.example/**"]
  mode: warn
  none: true
- name: team-a
  namespaces: ["team-?"]
  match: ["r.example/models/a"]
  allowCode: true
  none: true
`)
	if err != nil {
		t.Fatal(err)
	}
	v := NewVerifier(p, nil)
	const ref = "r.example/models/a@sha256:0000000000000000000000000000000000000000000000000000000000000000"
	for _, c := range []struct{ ns, ref, rule string }{
		{"", ref, "everyone"},
		{"dev", ref, "everyone"},
		{"prod", ref, "prod"},
		{"payments-eu", ref, "prod"},
		{"payments", ref, "everyone"},
		{"prod", "r.example/other/x@sha256:0000000000000000000000000000000000000000000000000000000000000000", "prod-later"},
		{"dev", "r.example/other/x@sha256:0000000000000000000000000000000000000000000000000000000000000000", "default"},
		{"team-b", ref, "team-a"},
		{"team-bb", ref, "everyone"},
	} {
		dec, err := v.VerifyIn(context.Background(), c.ns, c.ref)
		if err != nil || dec.Rule != c.rule || dec.Namespace != c.ns {
			t.Errorf("namespace %q, %s: rule %q (namespace %q), err %v; want %q", c.ns, c.ref, dec.Rule, dec.Namespace, err, c.rule)
		}
	}
	// The scan rules follow the same choice: allowCode applies only where its rule does.
	code := scan.Report{Verdict: scan.Code, Format: "pickle", Findings: []scan.Finding{{Verdict: scan.Code, Callable: "os.system"}}}
	if p.ScanNeededIn("team-b", ref) || !p.ScanNeededIn("dev", ref) || !p.ScanNeeded(ref) {
		t.Error("ScanNeeded does not follow the namespace's rule")
	}
	if err := p.AllowsScanIn("team-b", ref, "m.pkl", code); err != nil {
		t.Errorf("team-b's allowCode rule refused: %v", err)
	}
	if err := p.AllowsScanIn("dev", ref, "m.pkl", code); err == nil || !strings.Contains(err.Error(), `rule "everyone"`) {
		t.Errorf("dev under the unscoped rule: %v", err)
	}
}

// Bad namespaces are refused naming the field and what is valid.
func TestNamespaceScopeValidation(t *testing.T) {
	for doc, want := range map[string]string{
		"default: {none: true, namespaces: [a]}\n":                                                            "default.namespaces: not allowed",
		"default: {none: true}\nrules:\n- name: x\n  namespaces: [Prod]\n  match: [\"r/**\"]\n  none: true\n": `rules[0] ("x").namespaces[0]: "Prod" is not a namespace name or glob`,
		"default: {none: true}\nrules:\n- namespaces: [\"\"]\n  match: [\"r/**\"]\n  none: true\n":            `rules[0].namespaces[0]: "" is not a namespace name or glob`,
		"default: {none: true}\nrules:\n- namespaces: [a/b]\n  match: [\"r/**\"]\n  none: true\n":             `rules[0].namespaces[0]: "a/b"`,
		"default: {none: true}\nrules:\n- namespaces: [-a]\n  match: [\"r/**\"]\n  none: true\n":              `rules[0].namespaces[0]: "-a"`,
		"default: {none: true}\nrules:\n- namespaces: [prod]\n  none: true\n":                                 "rules[0].match: required",
	} {
		_, err := loadDoc(t, doc)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", doc, err, want)
		}
	}
}
