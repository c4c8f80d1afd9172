package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/modelpack/modelpack/internal/testenv"
)

// One reference, two namespaces: the real driver, over its socket, mounts an unsigned model for a pod in "dev"
// and refuses it (PERMISSION_DENIED naming the namespace-scoped rule) for a pod in "secure" although the node
// holds it from dev's publish; once the real cosign CLI signed it, a pod in a namespace matching a scoped rule's
// glob mounts it.
func TestDriverPolicyRuleScopedToNamespaces(t *testing.T) {
	e := newSigEnv(t)
	e.must(e.cosign, "generate-key-pair", "--output-key-prefix", "trusted")
	ref, _ := e.push("models/shared", "v1", "weights both namespaces use")
	policy := filepath.Join(e.dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`default: {mode: enforce, none: true}
rules:
- name: anyone
  match: ["%[1]s/models/**"]
  none: true
- name: secure-signed
  namespaces: [secure]
  match: ["%[1]s/models/**"]
  keys: [%[2]s]
  transparencyLog: waive
- name: regulated-signed
  namespaces: ["regulated-*"]
  match: ["%[1]s/**"]
  keys: [%[2]s]
  transparencyLog: waive
`, e.host, filepath.Join(e.dir, "trusted.pub"))), 0o644); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	drvCleanupMounts(t, root)
	p := drvStartWith(t, root, []string{"--policy", policy}, e.host)
	node := p.node()
	publish := func(pod, namespace string) (string, error) {
		target := drvKubelet(t, root, pod)
		return target, drvPublish(node, testenv.PublishRequest("vol-"+pod, target, map[string]string{
			"reference": ref, "csi.storage.k8s.io/pod.namespace": namespace, "csi.storage.k8s.io/pod.name": pod,
		}), time.Minute)
	}
	denied := func(pod, namespace, rule string) {
		t.Helper()
		target, err := publish(pod, namespace)
		drvWantCode(t, err, codes.PermissionDenied, `rule "`+rule+`"`)
		if m, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(m), target) {
			t.Fatalf("%s/%s: refused volume is mounted", namespace, pod)
		}
	}

	dev, err := publish("dev-pod", "dev")
	if err != nil {
		t.Fatalf("dev (unscoped rule, no signature needed): %v", err)
	}
	if got := drvRead(t, filepath.Join(dev, "model.safetensors")); got != "weights both namespaces use" {
		t.Fatalf("dev mounted %q", got)
	}
	// The node holds the model now: the secure namespace's rule still applies to its pods.
	denied("secure-pod", "secure", "secure-signed")
	// modelpack verify previews the same choice: --namespace picks the scoped rule, none the unscoped ones.
	e.mustFail(`rule "secure-signed"`, e.mp, "verify", ref, "--policy", policy, "--namespace", "secure", "--plain-http")
	if out := e.must(e.mp, "verify", ref, "--policy", policy, "--plain-http"); !strings.Contains(out, `rule "anyone"`) {
		t.Fatalf("verify without --namespace: %s", out)
	}

	e.must(e.cosign, "sign", "--key", "trusted.key", "--tlog-upload=false", "--allow-http-registry", "--yes", ref)
	// Signed now. A denial is cached for 30 s per rule and digest, so the signed model is asked for under a rule
	// that never denied it: a namespace matching the other scoped rule's glob.
	secure, err := publish("secure-pod-2", "regulated-eu")
	if err != nil {
		t.Fatalf("secure namespace after signing: %v", err)
	}
	if got := drvRead(t, filepath.Join(secure, "model.safetensors")); got != "weights both namespaces use" {
		t.Fatalf("secure mounted %q", got)
	}
	drvUnpublish(t, node, "vol-dev-pod", dev)
	drvUnpublish(t, node, "vol-secure-pod-2", secure)
}
