package e2e

// Signature interop with the real cosign CLI (v2.6.5) against a real registry: what modelpack signs cosign
// verifies, and what cosign signs (classic signatures, Sigstore bundles, certificates from a test CA) modelpack
// verifies. Nothing here uses the network: no transparency log, no TUF, a loopback registry.

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/signing/signingtest"
)

const sigPassword = "e2e-password"

type sigEnv struct {
	t                *testing.T
	mp, cosign, oras string
	host, dir        string
	env              []string
	reg              *testenv.Registry
}

func newSigEnv(t *testing.T) *sigEnv {
	t.Helper()
	e := &sigEnv{
		t: t, mp: testenv.Modelpack(t), cosign: testenv.Tool(t, "cosign"), oras: testenv.Tool(t, "oras"), dir: t.TempDir(),
	}
	e.reg = testenv.StartRegistry(t, testenv.RegistryOptions{})
	e.host = e.reg.Host
	home := t.TempDir()
	// A private HOME keeps cosign's TUF cache and docker config out of the way; COSIGN_EXPERIMENTAL stays off.
	e.env = append(os.Environ(), "HOME="+home, "DOCKER_CONFIG="+filepath.Join(home, ".docker"),
		"COSIGN_PASSWORD="+sigPassword, "COSIGN_YES=true", "TUF_ROOT="+filepath.Join(home, "tuf"))
	return e
}

// run runs a command in the test directory and returns stdout; failure is returned, not fatal.
func (e *sigEnv) run(bin string, args ...string) (string, string, error) {
	e.t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir, cmd.Env = e.dir, e.env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

func (e *sigEnv) must(bin string, args ...string) string {
	e.t.Helper()
	out, stderr, err := e.run(bin, args...)
	if err != nil {
		e.t.Fatalf("%s %s: %v\n%s%s", filepath.Base(bin), strings.Join(args, " "), err, out, stderr)
	}
	return out
}

func (e *sigEnv) mustFail(want string, bin string, args ...string) string {
	e.t.Helper()
	out, stderr, err := e.run(bin, args...)
	if err == nil {
		e.t.Fatalf("%s %s succeeded, want failure with %q:\n%s", filepath.Base(bin), strings.Join(args, " "), want, out)
	}
	if !strings.Contains(stderr, want) {
		e.t.Fatalf("%s %s: stderr does not say %q:\n%s", filepath.Base(bin), strings.Join(args, " "), want, stderr)
	}
	return stderr
}

// push pushes a one-file ModelPack-typed artifact with oras and returns repo@digest and the layer digest.
func (e *sigEnv) push(repo, tag, content string) (string, string) {
	e.t.Helper()
	dir := e.t.TempDir()
	signingtest.WriteFile(e.t, dir, "model.safetensors", []byte(content))
	ref := e.host + "/" + repo + ":" + tag
	cmd := exec.Command(e.oras, "push", "--plain-http", "--artifact-type", "application/vnd.cncf.model.manifest.v1+json",
		"--format", "json", ref, "model.safetensors:application/vnd.cncf.model.weight.v1.raw")
	cmd.Dir, cmd.Env = dir, e.env
	out, err := cmd.Output()
	if err != nil {
		e.t.Fatalf("oras push: %v %s", err, out)
	}
	var res struct {
		Digest string `json:"digest"`
	}
	if err := json.Unmarshal(out, &res); err != nil || res.Digest == "" {
		e.t.Fatalf("oras push output %q: %v", out, err)
	}
	manifest := e.must(e.oras, "manifest", "fetch", "--plain-http", ref)
	var m struct {
		Layers []struct {
			Digest string `json:"digest"`
		} `json:"layers"`
	}
	if err := json.Unmarshal([]byte(manifest), &m); err != nil || len(m.Layers) != 1 {
		e.t.Fatalf("manifest %s: %v", manifest, err)
	}
	return e.host + "/" + repo + "@" + res.Digest, m.Layers[0].Digest
}

func TestSigningModelpackSignCosignVerify(t *testing.T) {
	e := newSigEnv(t)
	e.must(e.mp, "key", "generate", "--output-key-prefix", "mp")
	e.must(e.cosign, "generate-key-pair", "--output-key-prefix", "other")
	ref, _ := e.push("models/llama", "v1", "llama weights")

	out := e.must(e.mp, "sign", e.host+"/models/llama:v1", "--key", "mp.key", "--plain-http")
	if !strings.Contains(out, ref) {
		t.Fatalf("sign should report the digest it signed (%s): %s", ref, out)
	}
	for _, r := range []string{e.host + "/models/llama:v1", ref} {
		payloads := e.must(e.cosign, "verify", "--key", "mp.pub", "--insecure-ignore-tlog", "--allow-http-registry", r)
		var got []struct {
			Critical struct {
				Image struct {
					Digest string `json:"docker-manifest-digest"`
				} `json:"image"`
				Type string `json:"type"`
			} `json:"critical"`
		}
		if err := json.Unmarshal([]byte(payloads), &got); err != nil || len(got) != 1 {
			t.Fatalf("cosign verify output %q: %v", payloads, err)
		}
		if got[0].Critical.Image.Digest != strings.SplitN(ref, "@", 2)[1] || got[0].Critical.Type != "cosign container image signature" {
			t.Fatalf("signed payload %+v, want the digest of %s", got[0], ref)
		}
	}
	e.mustFail("no matching signatures", e.cosign, "verify", "--key", "other.pub", "--insecure-ignore-tlog", "--allow-http-registry", ref)
	// cosign's own key works with modelpack sign too, and both keys' signatures sit side by side.
	e.must(e.mp, "sign", ref, "--key", "other.key", "--plain-http")
	e.must(e.cosign, "verify", "--key", "other.pub", "--insecure-ignore-tlog", "--allow-http-registry", ref)
	e.must(e.cosign, "verify", "--key", "mp.pub", "--insecure-ignore-tlog", "--allow-http-registry", ref)

	e.mustFail("not supported", e.mp, "sign", ref, "--key", "mp.key", "--tlog-upload=true")
	wrong := *e
	wrong.env = append(append([]string{}, e.env...), "COSIGN_PASSWORD=not-the-password")
	wrong.mustFail("decrypt", e.mp, "sign", ref, "--key", "mp.key", "--plain-http")
}

func TestSigningCosignSignModelpackVerify(t *testing.T) {
	e := newSigEnv(t)
	e.must(e.cosign, "generate-key-pair")
	e.must(e.mp, "key", "generate", "--output-key-prefix", "wrong")
	ref, layer := e.push("models/qwen", "v1", "qwen weights")
	e.must(e.cosign, "sign", "--key", "cosign.key", "--tlog-upload=false", "--allow-http-registry", "--yes", ref)

	out := e.must(e.mp, "verify", e.host+"/models/qwen:v1", "--key", "cosign.pub", "--insecure-ignore-tlog", "--plain-http")
	if !strings.Contains(out, "Verified "+ref) || !strings.Contains(out, "key cosign.pub") {
		t.Fatalf("verify output: %s", out)
	}
	var dec struct { // docs/json.md: verification
		Reference string `json:"reference"`
		Verified  bool   `json:"verified"`
	}
	if err := json.Unmarshal([]byte(e.must(e.mp, "verify", "--plain-http", ref, "--key", "cosign.pub", "--insecure-ignore-tlog", "-o", "json")), &dec); err != nil || !dec.Verified || dec.Reference != ref {
		t.Fatalf("json decision %+v: %v", dec, err)
	}

	t.Run("wrong key", func(t *testing.T) {
		e.mustFail("wrong key", e.mp, "verify", "--plain-http", ref, "--key", "wrong.pub", "--insecure-ignore-tlog")
	})
	t.Run("tlog is required unless waived", func(t *testing.T) {
		e.mustFail("--insecure-ignore-tlog", e.mp, "verify", "--plain-http", ref, "--key", "cosign.pub")
	})
	t.Run("policy: unsigned refused, tag moved refused", func(t *testing.T) {
		pol := signingtest.WriteFile(t, e.dir, "policy.yaml", []byte(`
default: {mode: enforce, none: true}
rules:
- name: models
  match: ["`+e.host+`/models/**"]
  keys: [cosign.pub]
  transparencyLog: waive
`))
		e.must(e.mp, "verify", "--plain-http", ref, "--policy", pol)
		unsigned, _ := e.push("models/unsigned", "v1", "nobody signed this")
		e.mustFail(`rule "models": no signature`, e.mp, "verify", "--plain-http", unsigned, "--policy", pol)
		// The tag is re-pointed at an unsigned digest after signing: the tag resolves to the new digest, which fails.
		e.push("models/qwen", "v1", "swapped weights")
		e.mustFail(`rule "models": no signature`, e.mp, "verify", "--plain-http", e.host+"/models/qwen:v1", "--policy", pol)
		e.must(e.mp, "verify", "--plain-http", ref, "--policy", pol)
	})
	t.Run("tampered layer is caught by the digest check", func(t *testing.T) {
		blob := e.reg.BlobPath(layer)
		orig, err := os.ReadFile(blob)
		if err != nil {
			t.Fatal(err)
		}
		bad := bytes.Clone(orig)
		bad[0] ^= 0xff
		if err := os.WriteFile(blob, bad, 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.WriteFile(blob, orig, 0o644)
		// The signature covers the manifest, and the manifest names each layer's digest: the signature still
		// verifies, and a pull of the signed digest refuses the altered bytes.
		e.must(e.mp, "verify", "--plain-http", ref, "--key", "cosign.pub", "--insecure-ignore-tlog")
		e.mustFail("digest", e.oras, "pull", "--plain-http", "-o", t.TempDir(), ref)
	})
}

func TestSigningCosignBundle(t *testing.T) {
	e := newSigEnv(t)
	e.must(e.cosign, "generate-key-pair")
	e.must(e.mp, "key", "generate", "--output-key-prefix", "wrong")
	ref, _ := e.push("models/bundled", "v1", "bundled weights")
	// cosign v3's default: a Sigstore bundle (DSSE in-toto statement) attached through the referrers API.
	e.must(e.cosign, "sign", "--new-bundle-format", "--key", "cosign.key", "--tlog-upload=false", "--allow-http-registry", "--yes", ref)
	if tags := e.must(e.oras, "repo", "tags", "--plain-http", e.host+"/models/bundled"); strings.Contains(tags, ".sig") {
		t.Fatalf("a bundle signature should not use the .sig tag: %s", tags)
	}
	out := e.must(e.mp, "verify", "--plain-http", ref, "--key", "cosign.pub", "--insecure-ignore-tlog")
	if !strings.Contains(out, "Sigstore bundle") {
		t.Fatalf("verify output: %s", out)
	}
	e.mustFail("wrong key", e.mp, "verify", "--plain-http", ref, "--key", "wrong.pub", "--insecure-ignore-tlog")
	other, _ := e.push("models/bundled", "v2", "other weights")
	e.mustFail("no signature", e.mp, "verify", "--plain-http", other, "--key", "cosign.pub", "--insecure-ignore-tlog")
}

func TestSigningCosignCertificateKeyless(t *testing.T) {
	e := newSigEnv(t)
	ca := signingtest.NewCA(t, "e2e fulcio")
	const issuer = "https://oidc.e2e.example"
	leaf, key := ca.Leaf(t, "builder@example.com", issuer)
	signingtest.WriteFile(t, e.dir, "leaf.pem", signingtest.CertPEM(leaf))
	signingtest.WriteFile(t, e.dir, "leaf-key.pem", signingtest.KeyPEM(t, key))
	signingtest.WriteFile(t, e.dir, "chain.pem", ca.ChainPEM())
	signingtest.WriteFile(t, e.dir, "root.pem", ca.RootPEM())
	e.must(e.cosign, "import-key-pair", "--key", "leaf-key.pem", "--output-key-prefix", "leaf")
	ref, _ := e.push("models/keyless", "v1", "keyless weights")
	// As keyless signing does, the signature carries the certificate and its chain in annotations.
	e.must(e.cosign, "sign", "--key", "leaf.key", "--certificate", "leaf.pem", "--certificate-chain", "chain.pem",
		"--tlog-upload=false", "--allow-http-registry", "--yes", ref)

	verify := func(extra ...string) []string {
		return append([]string{"verify", "--plain-http", ref, "--certificate-chain", "root.pem", "--insecure-ignore-tlog", "--insecure-ignore-sct"}, extra...)
	}
	out := e.must(e.mp, verify("--certificate-identity", "builder@example.com", "--certificate-oidc-issuer", issuer)...)
	if !strings.Contains(out, "keyless subject builder@example.com") {
		t.Fatalf("verify output: %s", out)
	}
	e.must(e.mp, verify("--certificate-identity-regexp", `@example\.com$`, "--certificate-oidc-issuer", issuer)...)
	e.mustFail("wrong identity", e.mp, verify("--certificate-identity", "mallory@example.com", "--certificate-oidc-issuer", issuer)...)
	e.mustFail("wrong identity", e.mp, verify("--certificate-identity", "builder@example.com", "--certificate-oidc-issuer", "https://evil.example")...)
	rogue := signingtest.NewCA(t, "rogue")
	signingtest.WriteFile(t, e.dir, "rogue-root.pem", rogue.RootPEM())
	e.mustFail("untrusted certificate", e.mp, "verify", "--plain-http", ref, "--certificate-chain", "rogue-root.pem", "--insecure-ignore-tlog", "--insecure-ignore-sct",
		"--certificate-identity", "builder@example.com", "--certificate-oidc-issuer", issuer)
	// cosign itself accepts the test CA's certificate the same way.
	e.must(e.cosign, "verify", "--certificate-chain", "chain.pem", "--certificate-identity", "builder@example.com",
		"--certificate-oidc-issuer", issuer, "--insecure-ignore-tlog", "--insecure-ignore-sct", "--allow-http-registry", ref)
}

// copy -r carries cosign's tag-based signatures and attestations (sha256-<hex>.sig / .att) of the root and of every
// manifest of an index, as cosign copy does: real cosign verifies the copy, in another repository of the same
// registry and in another registry.
func TestSigningCopyCarriesCosignTags(t *testing.T) {
	e := newSigEnv(t)
	e.must(e.mp, "key", "generate", "--output-key-prefix", "mp")
	a, _ := e.push("src/model", "a", "weights a")
	b, _ := e.push("src/model", "b", "weights b")
	e.must(e.oras, "manifest", "index", "create", "--plain-http", e.host+"/src/model:v1", "a", "b")
	for _, r := range []string{a, b, e.host + "/src/model:v1"} {
		e.must(e.mp, "sign", r, "--key", "mp.key", "--plain-http")
	}
	predicate := filepath.Join(e.dir, "predicate.json")
	os.WriteFile(predicate, []byte(`{"trained":"yes"}`), 0o644)
	e.must(e.cosign, "attest", "--key", "mp.key", "--predicate", predicate, "--type", "custom", "--tlog-upload=false",
		"--allow-http-registry", e.host+"/src/model:v1")
	other := testenv.StartRegistry(t, testenv.RegistryOptions{})
	digestOf := func(ref string) string { return ref[strings.LastIndex(ref, "@"):] }
	for _, dst := range []string{e.host + "/promoted/model", other.Host + "/mirror/model"} {
		e.must(e.mp, "copy", "-r", "--plain-http", e.host+"/src/model:v1", dst+":v1")
		for _, r := range []string{dst + ":v1", dst + digestOf(a), dst + digestOf(b)} {
			e.must(e.cosign, "verify", "--key", "mp.pub", "--insecure-ignore-tlog", "--allow-http-registry", r)
		}
		e.must(e.cosign, "verify-attestation", "--key", "mp.pub", "--type", "custom", "--insecure-ignore-tlog",
			"--allow-http-registry", dst+":v1")
		e.must(e.mp, "verify", dst+":v1", "--key", "mp.pub", "--insecure-ignore-tlog", "--plain-http")
	}
	// Without -r, only the artifact travels: cosign finds no signature on the copy.
	e.must(e.mp, "copy", "--plain-http", e.host+"/src/model:v1", other.Host+"/bare/model:v1")
	e.mustFail("no signatures found", e.cosign, "verify", "--key", "mp.pub", "--insecure-ignore-tlog", "--allow-http-registry", other.Host+"/bare/model:v1")
}
