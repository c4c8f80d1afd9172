package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelpack/modelpack/internal/testenv"
)

// TestSigningOMSBesideCosign signs one model with cosign's classic signature and another with a cosign Sigstore
// bundle (referrer), and both with OpenSSF Model Signing (modelpack sign --format oms, a referrer too). The real
// cosign CLI must still verify each in the mode its signature calls for: cosign verify lists every referrer of the
// digest, takes any whose one layer is a Sigstore bundle for a signature of the manifest, and switches to bundle
// mode when it finds one; an OMS bundle (whose subjects are the model's files) must not be taken for one. modelpack
// verify (both formats) and the node accept both models, in the registry they were signed in and after copy -r
// to another registry.
func TestSigningOMSBesideCosign(t *testing.T) {
	e := newSigEnv(t)
	e.env = append(e.env, "MODELPACK_HOME="+filepath.Join(t.TempDir(), "store"))
	e.must(e.mp, "key", "generate", "--output-key-prefix", "mp")
	classic, _ := e.push("models/classic", "v1", "weights signed the classic way")
	bundled, _ := e.push("models/bundled", "v1", "weights signed with a bundle")

	e.must(e.mp, "sign", classic, "--key", "mp.key", "--plain-http")
	e.must(e.cosign, "sign", "--new-bundle-format", "--key", "mp.key", "--tlog-upload=false", "--allow-http-registry", "--yes", bundled)
	for _, r := range []string{classic, bundled} {
		e.must(e.mp, "sign", r, "--key", "mp.key", "--format", "oms", "--plain-http")
	}
	// The OMS referrer is one file, model.sig, that oras pulls as it is and model_signing verify reads.
	idx := e.must(e.oras, "discover", "--plain-http", "--format", "json", classic)
	var disc struct {
		Referrers []struct {
			ArtifactType string `json:"artifactType"`
			Digest       string `json:"digest"`
		} `json:"referrers"`
		Manifests []struct {
			ArtifactType string `json:"artifactType"`
			Digest       string `json:"digest"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal([]byte(idx), &disc); err != nil {
		t.Fatalf("oras discover: %v %s", err, idx)
	}
	refs := append(disc.Referrers, disc.Manifests...)
	if len(refs) != 1 || refs[0].ArtifactType != "application/vnd.modelpack.oms.signature.v1+json" {
		t.Fatalf("referrers of %s: %s", classic, idx)
	}
	out := t.TempDir()
	e.must(e.oras, "pull", "--plain-http", "-o", out, e.host+"/models/classic@"+refs[0].Digest)
	if b, err := os.ReadFile(filepath.Join(out, "model.sig")); err != nil || !strings.Contains(string(b), `"application/vnd.dev.sigstore.bundle.v0.3+json"`) {
		t.Fatalf("oras pull of the OMS referrer: model.sig %q: %v", b, err)
	}

	other := testenv.StartRegistry(t, testenv.RegistryOptions{})
	copied := map[string]string{}
	for _, r := range []string{classic, bundled} {
		repo := strings.TrimPrefix(r[:strings.Index(r, "@")], e.host+"/")
		dst := other.Host + "/mirror/" + strings.TrimPrefix(repo, "models/")
		e.must(e.mp, "copy", "-r", "--plain-http", e.host+"/"+repo+":v1", dst+":v1")
		copied[r] = dst + r[strings.Index(r, "@"):]
	}

	cosignVerify := func(ref string, extra ...string) {
		t.Helper()
		args := append([]string{"verify", "--key", "mp.pub", "--insecure-ignore-tlog", "--allow-http-registry"}, extra...)
		e.must(e.cosign, append(args, ref)...)
	}
	for _, r := range []string{classic, copied[classic]} {
		cosignVerify(r) // classic mode: no referrer may look like a cosign bundle
		e.must(e.mp, "verify", r, "--key", "mp.pub", "--insecure-ignore-tlog", "--plain-http")
		e.must(e.mp, "verify", r, "--format", "oms", "--key", "mp.pub", "--plain-http")
	}
	// Bundle mode wants a trusted root even for a key; offline, an empty one (no CA, no log) does.
	root0 := filepath.Join(e.dir, "trusted_root.json")
	if err := os.WriteFile(root0, []byte(`{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{bundled, copied[bundled]} {
		cosignVerify(r, "--new-bundle-format", "--trusted-root", root0)
		cosignVerify(r, "--trusted-root", root0) // cosign finds the bundle itself
		if o := e.must(e.mp, "verify", r, "--key", "mp.pub", "--insecure-ignore-tlog", "--plain-http"); !strings.Contains(o, "Sigstore bundle") {
			t.Fatalf("verify of %s: %s", r, o)
		}
		e.must(e.mp, "verify", r, "--format", "oms", "--key", "mp.pub", "--plain-http")
	}

	// The node requires both signatures, a cosign one and an OMS one, by the same key.
	pub := filepath.Join(e.dir, "mp.pub")
	policy := filepath.Join(e.dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`default: {mode: enforce, none: true}
rules:
- name: signed-twice
  match: ["%s/**", "%s/**"]
  keys: [%s]
  transparencyLog: waive
  oms: {keys: [%s]}
`, e.host, other.Host, pub, pub)), 0o644); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	drvCleanupMounts(t, root)
	p := drvStartWith(t, root, []string{"--policy", policy}, e.host, other.Host)
	node := p.node()
	i := 0
	for _, r := range []string{classic, copied[classic], bundled, copied[bundled]} {
		i++
		pod := fmt.Sprintf("pod%d", i)
		target := drvKubelet(t, root, pod)
		a := map[string]string{"reference": r, "csi.storage.k8s.io/ephemeral": "true"}
		if err := drvPublish(node, testenv.PublishRequest("vol-"+pod, target, a), time.Minute); err != nil {
			t.Fatalf("node publish of %s: %v", r, err)
		}
		want := "weights signed the classic way"
		if strings.Contains(r, "bundled") {
			want = "weights signed with a bundle"
		}
		if got := drvRead(t, filepath.Join(target, "model.safetensors")); got != want {
			t.Fatalf("mounted %s: %q", r, got)
		}
		drvUnpublish(t, node, "vol-"+pod, target)
	}
}
