package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"

	"github.com/modelpack/modelpack/internal/testenv"
)

// TestDriverVerifiesBeforeMounting runs the real driver with a trust policy against a real registry whose
// signatures come from the real cosign CLI. Every refusal is PERMISSION_DENIED naming the rule and the reason,
// leaves nothing mounted, and — counted at a proxy in front of the registry — fetches no layer byte.
func TestDriverVerifiesBeforeMounting(t *testing.T) {
	e := newSigEnv(t)
	proxy := drvStartProxy(t, e.host)
	e.must(e.cosign, "generate-key-pair", "--output-key-prefix", "trusted")
	e.must(e.cosign, "generate-key-pair", "--output-key-prefix", "other")
	sign := func(ref, key string) {
		e.must(e.cosign, "sign", "--key", key, "--tlog-upload=false", "--allow-http-registry", "--yes", ref)
	}

	signedRef, signedLayer := e.push("models/signed", "v1", "signed weights")
	sign(signedRef, "trusted.key")
	_, unsignedLayer := e.push("models/unsigned", "v1", "unsigned weights")
	otherRef, otherLayer := e.push("models/otherkey", "v1", "weights signed by another key")
	sign(otherRef, "other.key")
	_, warnLayer := e.push("rollout/unsigned", "v1", "weights under a warn rule")

	policy := filepath.Join(e.dir, "policy.yaml")
	pub := filepath.Join(e.dir, "trusted.pub")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`default: {mode: enforce, none: true}
rules:
- name: team-models
  match: ["%[1]s/models/**"]
  mode: enforce
  keys: [%[2]s]
  transparencyLog: waive
- name: rollout
  match: ["%[1]s/rollout/**"]
  mode: warn
  keys: [%[2]s]
  transparencyLog: waive
`, proxy.Host, pub)), 0o644); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	drvCleanupMounts(t, root)
	p := drvStartWith(t, root, []string{"--policy", policy}, proxy.Host)
	node := p.node()
	publish := func(pod, repo string, attrs ...string) (string, error) {
		target := drvKubelet(t, root, pod)
		a := map[string]string{"reference": proxy.Host + "/" + repo + ":v1", "csi.storage.k8s.io/ephemeral": "true"}
		for i := 0; i+1 < len(attrs); i += 2 {
			a[attrs[i]] = attrs[i+1]
		}
		return target, drvPublish(node, testenv.PublishRequest("vol-"+pod, target, a), time.Minute)
	}
	refused := func(pod, repo, reason string, layer string) {
		t.Helper()
		target, err := publish(pod, repo)
		drvWantCode(t, err, codes.PermissionDenied, reason)
		if !strings.Contains(err.Error(), `rule "team-models"`) {
			t.Fatalf("refusal does not name the rule: %v", err)
		}
		if m, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(m), target) {
			t.Fatalf("%s: refused volume is mounted", repo)
		}
		if n := proxy.blobGetsOf(digest.Digest(layer)); n != 0 {
			t.Fatalf("%s: %d GETs of the layer before verification succeeded", repo, n)
		}
	}

	// Signed by the trusted key (with the cosign CLI): mounted.
	target, err := publish("signed", "models/signed")
	if err != nil {
		t.Fatalf("signed model: %v", err)
	}
	if got := drvRead(t, filepath.Join(target, "model.safetensors")); got != "signed weights" {
		t.Fatalf("mounted content %q", got)
	}
	if n := proxy.blobGetsOf(digest.Digest(signedLayer)); n != 1 {
		t.Fatalf("signed layer fetched %d times, want 1", n)
	}

	refused("unsigned", "models/unsigned", "no signature", unsignedLayer)
	refused("otherkey", "models/otherkey", "", otherLayer)

	// The tag moves to an unsigned digest after signing: the driver resolves it once, verifies that digest and
	// refuses, even though the node already holds the signed content under the same reference.
	_, movedLayer := e.push("models/signed", "v1", "tampered weights pushed over the signed tag")
	target2, err := publish("moved", "models/signed", "pullPolicy", "Always")
	drvWantCode(t, err, codes.PermissionDenied, "no signature")
	if m, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(m), target2) {
		t.Fatal("moved tag: refused volume is mounted")
	}
	if n := proxy.blobGetsOf(digest.Digest(movedLayer)); n != 0 {
		t.Fatalf("moved tag: %d GETs of the unsigned layer", n)
	}

	// A warn rule mounts and logs why it would have refused.
	target3, err := publish("warned", "rollout/unsigned")
	if err != nil {
		t.Fatalf("warn rule: %v", err)
	}
	if got := drvRead(t, filepath.Join(target3, "model.safetensors")); got != "weights under a warn rule" {
		t.Fatalf("warned content %q", got)
	}
	if n := proxy.blobGetsOf(digest.Digest(warnLayer)); n != 1 {
		t.Fatalf("warned layer fetched %d times", n)
	}
	logb, _ := os.ReadFile(p.log)
	if !strings.Contains(string(logb), "allowed by a warn rule") || !strings.Contains(string(logb), `rule=rollout`) {
		t.Fatalf("the driver log does not record the warn-rule pass:\n%s", logb)
	}

	if got := p.metric("modelpack_signature_verifications_total", `result="denied"`); got < 3 {
		t.Fatalf("denied verifications metric = %v, want >= 3", got)
	}
	if got := p.metric("modelpack_signature_verifications_total", `result="verified"`); got < 1 {
		t.Fatalf("verified metric = %v", got)
	}
	drvUnpublish(t, node, "vol-signed", target)
	drvUnpublish(t, node, "vol-warned", target3)
}
