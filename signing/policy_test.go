package signing

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/signing/signingtest"
)

func TestLoadPolicyErrors(t *testing.T) {
	dir := t.TempDir()
	_, pub := newKeys(t, dir, "k")
	chain := writeFile(t, dir, "chain.pem", string(signingtest.NewCA(t, "p").RootPEM()))
	cases := []struct{ name, yaml, want string }{
		{"empty", "", "empty document"},
		{"unknown field", "default:\n  none: true\n  kyes: [a]\n", "line 3: field kyes not found"},
		{"bad mode", "default:\n  mode: enforcing\n  none: true\n", `default.mode: "enforcing" is not valid (valid: enforce, warn, off)`},
		{"no requirement", "default:\n  mode: enforce\n", "default: no requirement: set keys, keyless, oms, scanAttestation, or none: true"},
		{"none and keys", "default:\n  none: true\n  keys: [" + pub + "]\n", "none: true cannot be combined with keys, keyless, oms or scanAttestation"},
		{"default match", "default:\n  match: [a/*]\n  none: true\n", "default.match: not allowed"},
		{"rule without match", "default: {none: true}\nrules:\n- name: r\n  none: true\n", "rules[0].match: required"},
		{"bad pattern", "default: {none: true}\nrules:\n- match: [\"reg/a@sha256:x\"]\n  none: true\n", "rules[0].match[0]"},
		{"duplicate name", "default: {none: true}\nrules:\n- {name: a, match: [x/*], none: true}\n- {name: a, match: [y/*], none: true}\n", `rules[1].name: "a" is already the name of rules[0]`},
		{"missing key", "default:\n  keys: [/nonexistent.pub]\n  transparencyLog: waive\n", "default.keys[0]: open /nonexistent.pub"},
		{"not a key", "default:\n  keys: [" + chain + "]\n  transparencyLog: waive\n", "not a PEM public key"},
		{"tlog without rekor", "default:\n  keys: [" + pub + "]\n", "default.transparencyLog: require needs Rekor keys"},
		{"bad check", "default:\n  keys: [" + pub + "]\n  transparencyLog: skip\n", `default.transparencyLog: "skip" is not valid (valid: require, waive)`},
		{"keyless without root", "default:\n  keyless: [{issuer: i, subject: s}]\n  transparencyLog: waive\n", "keyless identities need trustRoot.certificateChain"},
		{"keyless without sct keys", "default:\n  keyless: [{issuer: i, subject: s}]\n  trustRoot: {certificateChain: " + chain + "}\n  transparencyLog: waive\n", "default.certificateTransparency: require needs CT log keys"},
		{"keyless two subjects", "default:\n  keyless: [{issuer: i, subject: s, subjectRegExp: x}]\n  trustRoot: {certificateChain: " + chain + "}\n  transparencyLog: waive\n  certificateTransparency: waive\n", "default.keyless[0]: set exactly one of subject and subjectRegExp"},
		{"keyless bad regexp", "default:\n  keyless: [{issuer: i, subjectRegExp: \"(\"}]\n  trustRoot: {certificateChain: " + chain + "}\n  transparencyLog: waive\n  certificateTransparency: waive\n", "default.keyless[0]: subjectRegExp: error parsing regexp"},
		{"trusted root and chain", "default:\n  keyless: [{issuer: i, subject: s}]\n  trustRoot: {trustedRoot: x.json, certificateChain: " + chain + "}\n", "trustedRoot cannot be combined"},
		{"chain without root", "default:\n  keyless: [{issuer: i, subject: s}]\n  trustRoot: {certificateChain: " + pub + "}\n", "holds no PEM certificates"},
		{"bad k8s ref", "default:\n  keys: [k8s://Bad_NS]\n  transparencyLog: waive\n", "want k8s://NAMESPACE/NAME"},
		{"bad scheme", "default:\n  keys: [\"gcpkms://x\"]\n  transparencyLog: waive\n", "unsupported key reference"},
		{"type error", "default:\n  keys: {a: b}\n", "line 2: cannot unmarshal"},
		{"scan attestation without keys", "default:\n  scanAttestation: {}\n  transparencyLog: waive\n", "default.scanAttestation.keys: required: at least one cosign public key"},
		{"scan attestation keyless", "default:\n  scanAttestation: {keyless: [{issuer: i, subject: s}]}\n", "field keyless not found"},
		{"scan attestation missing key", "default:\n  scanAttestation: {keys: [/nonexistent.pub]}\n  transparencyLog: waive\n", "default.scanAttestation.keys[0]: open /nonexistent.pub"},
		{"scan attestation tlog", "default:\n  scanAttestation: {keys: [" + pub + "]}\n", "default.transparencyLog: require needs Rekor keys"},
		{"none and scan attestation", "default:\n  none: true\n  scanAttestation: {keys: [" + pub + "]}\n", "none: true cannot be combined with keys, keyless, oms or scanAttestation"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := writeFile(t, t.TempDir(), "policy.yaml", c.yaml)
			_, err := LoadPolicy(path)
			if err == nil {
				t.Fatalf("policy accepted:\n%s", c.yaml)
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q\nwant it to name %q and the file", err, c.want)
			}
		})
	}
}

func TestPolicyRuleSelection(t *testing.T) {
	dir := t.TempDir()
	_, pub := newKeys(t, dir, "k")
	path := writeFile(t, dir, "policy.yaml", `
default: {mode: enforce, none: true}
rules:
- name: team
  match: ["localhost:5000/models/**", "registry.example.com/*/llama"]
  keys: [`+pub+`]
  transparencyLog: waive
- name: hub
  match: ["docker.io/library/*"]
  mode: off
`)
	p, err := LoadPolicy(path)
	if err != nil {
		t.Fatal(err)
	}
	for repo, want := range map[string]string{
		"localhost:5000/models":              "team",
		"localhost:5000/models/a/b":          "team",
		"localhost:5000/modelsx":             "default",
		"registry.example.com/org/llama":     "team",
		"registry.example.com/org/sub/llama": "default",
		"docker.io/library/ubuntu":           "hub",
		"docker.io/acme/ubuntu":              "default",
	} {
		if got := p.ruleFor(repo).name; got != want {
			t.Errorf("%s: rule %q, want %q", repo, got, want)
		}
	}
	if p.rules[1].mode != Off || p.def.mode != Enforce || !p.def.none {
		t.Fatalf("modes not as written: %+v %+v", p.rules[1], p.def)
	}
}

func TestPolicyVersionFollowsKeyFiles(t *testing.T) {
	dir := t.TempDir()
	_, pub := newKeys(t, dir, "k")
	path := writeFile(t, dir, "policy.yaml", "default:\n  keys: ["+pub+"]\n  transparencyLog: waive\n")
	p1, err := LoadPolicy(path)
	if err != nil {
		t.Fatal(err)
	}
	p2, _ := LoadPolicy(path)
	if p1.Version() != p2.Version() {
		t.Fatal("same content, different versions")
	}
	if err := os.Remove(pub); err != nil {
		t.Fatal(err)
	}
	if _, _, err := GenerateKeyPair(filepath.Join(dir, "k"), testPass, false); err == nil {
		t.Fatal("GenerateKeyPair overwrote k.key without force")
	}
	if _, _, err := GenerateKeyPair(filepath.Join(dir, "k"), testPass, true); err != nil {
		t.Fatal(err)
	}
	p3, err := LoadPolicy(path)
	if err != nil {
		t.Fatal(err)
	}
	if p3.Version() == p1.Version() {
		t.Fatal("a rotated key file did not change the policy version")
	}
}

func TestKeyReferences(t *testing.T) {
	dir := t.TempDir()
	key, pub := newKeys(t, dir, "k")
	pubPEM, _ := os.ReadFile(pub)
	keyPEM, _ := os.ReadFile(key)
	secrets := t.TempDir()
	sdir := filepath.Join(secrets, "ml", "cosign")
	if err := os.MkdirAll(sdir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, sdir, "cosign.pub", string(pubPEM))
	writeFile(t, sdir, "cosign.key", string(keyPEM))
	writeFile(t, sdir, "cosign.password", testPassword)
	t.Setenv("MP_TEST_PUB", string(pubPEM))

	p, err := NewPolicy(PolicyFile{SecretsDir: secrets, Default: Rule{Keys: []string{"env://MP_TEST_PUB", "k8s://ml/cosign", pub}, TransparencyLog: Waive}})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(p.def.authorities); n != 3 {
		t.Fatalf("%d authorities", n)
	}
	if _, err := NewPolicy(PolicyFile{Default: Rule{Keys: []string{"env://MP_TEST_UNSET"}, TransparencyLog: Waive}}); err == nil || !strings.Contains(err.Error(), `environment variable "MP_TEST_UNSET" is not set`) {
		t.Fatalf("unset env key: %v", err)
	}
	// A k8s:// Secret brings its own password; the PassFunc is not asked.
	if _, err := loadSigner("k8s://ml/cosign", secrets, func(bool) ([]byte, error) { t.Fatal("password asked"); return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := loadSigner(key, "", func(bool) ([]byte, error) { return []byte("wrong"), nil }); err == nil || !strings.Contains(err.Error(), "decrypt") {
		t.Fatalf("wrong password: %v", err)
	}
	t.Setenv("MP_TEST_KEY", string(keyPEM))
	if _, err := loadSigner("env://MP_TEST_KEY", "", testPass); err != nil {
		t.Fatal(err)
	}
}

func TestGlob(t *testing.T) {
	for _, c := range []struct {
		glob, repo string
		match      bool
	}{
		{"r/a/*", "r/a/b", true},
		{"r/a/*", "r/a/b/c", false},
		{"r/a/**", "r/a/b/c", true},
		{"r/a/**", "r/a", true},
		{"r/**/m", "r/x/y/m", true},
		{"r/a?", "r/ab", true},
		{"r/a?", "r/a/", false},
		{"localhost:5000/m", "localhost:5000/m", true},
		{"index.docker.io/library/*", "docker.io/library/x", true},
		{"r.io/a.b", "r.io/aXb", false},
	} {
		re, err := compileGlob(c.glob)
		if err != nil {
			t.Fatal(err)
		}
		if re.MatchString(c.repo) != c.match {
			t.Errorf("%s ~ %s: want %v", c.glob, c.repo, c.match)
		}
	}
}
