//go:build cluster

package cluster

import (
	"encoding/base64"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
	"github.com/modelpack/modelpack/internal/testenv"
)

// installNativeVolumes installs the admission policy for native image volumes the way a `kubectl apply -f` user
// does (deploy/rendered/native-volumes.yaml, then the prefixes set on the policy), removes it when the test ends,
// and waits until the API server applies it: a server-side dry run of probe shows a rewritten volume.
func installNativeVolumes(t *testing.T, c *harness.Cluster, prefixes []string, probe string) {
	t.Helper()
	manifest, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "deploy", "rendered", "native-volumes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c.Apply(t, string(manifest))
	list := `["` + strings.Join(prefixes, `", "`) + `"]`
	patch := fmt.Sprintf(`[{"op": "replace", "path": "/spec/variables/0/expression", "value": %q}]`, list)
	c.Kubectl(t, "patch", "mutatingadmissionpolicy", "modelpack-image-volumes", "--type=json", "-p", patch)
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := c.RunInput(probe, "create", "--dry-run=server", "-o", "json", "-f", "-")
		if err == nil && strings.Contains(out, `"driver": "modelpack.csi.dev"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the API server does not apply the policy after a minute: %v\n%s", err, out)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestNativeSyntax is the pod, written the Kubernetes 1.36 way (volumes[].image), on the real API server
// with the policy from deploy/: a signed ModelPack artifact under an enforce rule is mounted by the driver and
// its container reads the weights byte for byte; in the same pod a container image outside the prefixes still
// goes through containerd's native image volume; an unsigned artifact is refused with the rule in the pod's
// events.
func TestNativeSyntax(t *testing.T) {
	c := harness.Connect(t)
	weights := genModel(t, 601, 2)
	signed, _ := c.PushModel(t, weights, "e2e/native/llama3-8b:v1")
	unsigned, _ := c.PushModel(t, genModel(t, 602, 1), "e2e/native/unsigned:v1")
	data := filepath.Join(t.TempDir(), "hello.txt")
	if err := os.WriteFile(data, []byte("hello from a container image layer\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tools := c.PushImage(t, "e2e/native-tools:v1", data+"=/data/hello.txt")

	const rule = "e2e-native-models"
	sign := enforceSignatures(t, c, rule, c.Registry+"/e2e/native/**")
	sign(signed)

	// The reference as the user writes it: by tag.
	model := c.Registry + "/e2e/native/llama3-8b:v1"
	const weightsDir, toolsDir = "/models/llama3", "/tools"
	pod := c.PodManifest(harness.PodSpec{Name: "native-syntax",
		Script: harness.SumScript(weightsDir) + "; echo '--- tools'; cat " + toolsDir + "/data/hello.txt",
		Volumes: []harness.Volume{
			{Name: "model-weights", MountPath: weightsDir, Image: model},
			{Name: "tools", MountPath: toolsDir, Image: tools},
		}})
	installNativeVolumes(t, c, []string{c.Registry + "/e2e/native"}, pod)
	c.Apply(t, pod)

	stored := c.Pod(t, "default", "native-syntax")
	vols := map[string]corev1.Volume{}
	for _, v := range stored.Spec.Volumes {
		vols[v.Name] = v
	}
	if csi := vols["model-weights"].CSI; csi == nil || csi.Driver != "modelpack.csi.dev" || csi.ReadOnly == nil || !*csi.ReadOnly ||
		!maps.Equal(csi.VolumeAttributes, map[string]string{"reference": model, "pullPolicy": "IfNotPresent"}) ||
		vols["model-weights"].Image != nil {
		t.Errorf("stored volume model-weights is not the driver's: %+v", vols["model-weights"])
	}
	if img := vols["tools"].Image; img == nil || img.Reference != tools || vols["tools"].CSI != nil {
		t.Errorf("stored volume tools is no longer the native image volume: %+v", vols["tools"])
	}

	c.WaitPhase(t, "default", "native-syntax", corev1.PodSucceeded, podTimeout)
	log := c.Logs(t, "default", "native-syntax", "")
	sums, rest, _ := strings.Cut(log, "--- tools")
	if got, want := harness.ParseSums(t, sums, weightsDir), harness.TreeSums(t, weights); !maps.Equal(got, want) {
		t.Errorf("the container read other bytes than the model:\ngot  %v\nwant %v", got, want)
	}
	if !strings.Contains(rest, "hello from a container image layer") {
		t.Errorf("the container image volume outside the prefixes did not come through containerd:\n%s", rest)
	}

	c.Apply(t, c.PodManifest(harness.PodSpec{Name: "native-unsigned", Script: harness.SumScript(weightsDir),
		Volumes: []harness.Volume{{Name: "model-weights", MountPath: weightsDir, Image: unsigned}}}))
	event := waitEvent(t, c, "default", "native-unsigned", "FailedMount", regexp.MustCompile(regexp.QuoteMeta(rule)))
	t.Logf("refused as expected: %s", event)
	if p := c.Pod(t, "default", "native-unsigned"); p.Status.Phase != corev1.PodPending {
		t.Errorf("the unsigned model's pod is %s, want Pending", p.Status.Phase)
	}
}

// TestNativeSyntaxPullSecret: the pod's first imagePullSecret reaches the driver as the volume's
// nodePublishSecretRef. A kubernetes.io/dockerconfigjson Secret is accepted and the pod reads its model; a first
// Secret that is not a docker config is refused by the driver by that name, which only it can have read.
func TestNativeSyntaxPullSecret(t *testing.T) {
	c := harness.Connect(t)
	weights := genModel(t, 611, 1)
	ref, _ := c.PushModel(t, weights, "e2e/native-secret/m:v1")
	auth := base64.StdEncoding.EncodeToString([]byte("e2e:e2e-password"))
	secrets := fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: e2e-models-pull, namespace: default}
type: kubernetes.io/dockerconfigjson
stringData:
  .dockerconfigjson: '{"auths": {"%s": {"auth": "%s"}}}'
---
apiVersion: v1
kind: Secret
metadata: {name: e2e-not-docker, namespace: default}
type: Opaque
stringData:
  token: not-a-docker-config
`, c.Registry, auth)
	c.Apply(t, secrets)

	const mnt = "/models/m"
	withSecret := func(name, secret string) string {
		var pod map[string]any
		manifest := c.PodManifest(harness.PodSpec{Name: name, Script: harness.SumScript(mnt),
			Volumes: []harness.Volume{{Name: "model", MountPath: mnt, Image: ref}}})
		if err := yaml.Unmarshal([]byte(manifest), &pod); err != nil {
			t.Fatal(err)
		}
		pod["spec"].(map[string]any)["imagePullSecrets"] = []map[string]string{{"name": secret}, {"name": "e2e-unused"}}
		b, err := yaml.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	good := withSecret("native-secret", "e2e-models-pull")
	installNativeVolumes(t, c, []string{c.Registry + "/e2e/native-secret"}, good)
	c.Apply(t, good)
	stored := c.Pod(t, "default", "native-secret")
	if csi := stored.Spec.Volumes[0].CSI; csi == nil || csi.NodePublishSecretRef == nil || csi.NodePublishSecretRef.Name != "e2e-models-pull" {
		t.Fatalf("stored volume has no nodePublishSecretRef to the first pull secret: %+v", stored.Spec.Volumes[0])
	}
	c.WaitPhase(t, "default", "native-secret", corev1.PodSucceeded, podTimeout)
	if got, want := harness.ParseSums(t, c.Logs(t, "default", "native-secret", ""), mnt), harness.TreeSums(t, weights); !maps.Equal(got, want) {
		t.Errorf("the container read other bytes than the model:\ngot  %v\nwant %v", got, want)
	}

	c.Apply(t, withSecret("native-bad-secret", "e2e-not-docker"))
	event := waitEvent(t, c, "default", "native-bad-secret", "FailedMount", regexp.MustCompile(`nodePublishSecretRef must be a kubernetes.io/dockerconfigjson secret`))
	t.Logf("refused as expected: %s", event)
}
