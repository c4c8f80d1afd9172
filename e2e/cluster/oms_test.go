//go:build cluster

package cluster

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
	corev1 "k8s.io/api/core/v1"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
)

// TestOMSPolicy: a model signed by the OpenSSF Model Signing reference implementation (its published
// v1.0.0-certificate vector, model.sig beside the files) is packed as users pack it and mounts under an enforce
// rule trusting the vector's CA (delivered in the modelpack-keys Secret); the same model with one byte changed on
// disk before packing gets a FailedMount naming the rule and the file, and the registry serves none of its model
// layers.
func TestOMSPolicy(t *testing.T) {
	c := harness.Connect(t)
	vectors, _ := filepath.Abs("../../signing/oms/testdata/vectors")
	good := filepath.Join(t.TempDir(), "oms-good")
	bad := filepath.Join(t.TempDir(), "oms-bad")
	for _, d := range []string{good, bad} {
		if err := os.CopyFS(d, os.DirFS(filepath.Join(vectors, "v1.0.0-certificate"))); err != nil {
			t.Fatal(err)
		}
	}
	dd := exec.Command("dd", "of="+filepath.Join(bad, "signme-1"), "bs=1", "seek=1", "count=1", "conv=notrunc", "status=none")
	dd.Stdin = strings.NewReader("Z")
	if out, err := dd.CombinedOutput(); err != nil {
		t.Fatalf("dd: %v %s", err, out)
	}
	goodRef, _ := c.PushModel(t, good, "e2e/oms/good:v1")
	badRef, badLayers := c.PushModel(t, bad, "e2e/oms/bad:v1")

	const rule = "e2e-oms-models"
	oldPolicy := c.Policy(t)
	c.Kubectl(t, "-n", harness.Namespace, "create", "secret", "generic", "modelpack-keys", "--from-file=oms-ca.pem="+filepath.Join(vectors, "keys/ca-cert.pem"))
	c.SetPolicy(t, fmt.Sprintf(`default:
  mode: enforce
  none: true
rules:
- name: %s
  match: ["%s/e2e/oms/**"]
  mode: enforce
  oms:
    certificateChains: [/etc/modelpack/keys/oms-ca.pem]
`, rule, c.Registry))
	t.Cleanup(func() {
		c.SetPolicy(t, oldPolicy)
		c.Run("-n", harness.Namespace, "delete", "secret", "modelpack-keys", "--ignore-not-found")
	})
	restartDriver(t, c)

	mark := c.Mark(t)
	const mnt = "/models/m"
	c.Apply(t, c.PodManifest(harness.PodSpec{Name: "oms-tampered", Script: harness.SumScript(mnt),
		Volumes: []harness.Volume{{Name: "model", MountPath: mnt, CSI: map[string]string{"reference": badRef}}}}))
	event := waitEvent(t, c, "default", "oms-tampered", "FailedMount", regexp.MustCompile(regexp.QuoteMeta(rule)+`.*signme-1`))
	t.Logf("refused as expected: %s", event)
	pod := c.Pod(t, "default", "oms-tampered")
	if pod.Status.Phase != corev1.PodPending {
		t.Errorf("tampered model's pod: want Pending, got %s", pod.Status.Phase)
	}
	gets := c.BlobGETs(t, mark)
	sig := digestOfFile(t, filepath.Join(bad, "model.sig"))
	for _, l := range badLayers {
		if l != sig && gets[l] != 0 {
			t.Errorf("the registry served model layer %s %d times before the policy refused it", l, gets[l])
		}
	}

	c.Apply(t, c.PodManifest(harness.PodSpec{Name: "oms-signed", Script: harness.SumScript(mnt),
		Volumes: []harness.Volume{{Name: "model", MountPath: mnt, CSI: map[string]string{"reference": goodRef}}}}))
	c.WaitPhase(t, "default", "oms-signed", corev1.PodSucceeded, podTimeout)
	if got, want := harness.ParseSums(t, c.Logs(t, "default", "oms-signed", ""), mnt), harness.TreeSums(t, good); !maps.Equal(got, want) {
		t.Errorf("OMS-signed model: the container read other bytes than the source:\ngot  %v\nwant %v", got, want)
	}
}

func digestOfFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return digest.FromBytes(b).String()
}
