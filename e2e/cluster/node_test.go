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
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
	"github.com/modelpack/modelpack/internal/testenv"
)

// TestTrustPolicy: under an enforce rule, a pod naming an unsigned model stays in ContainerCreating with a
// FailedMount event that names the rule, and the registry serves none of the model's layers; the signed
// model's pod runs and reads the right bytes. The policy and key go in as users put them: the driver's policy
// ConfigMap and the modelpack-keys Secret.
func TestTrustPolicy(t *testing.T) {
	c := harness.Connect(t)
	signedSrc := genModel(t, 501, 2)
	signed, _ := c.PushModel(t, signedSrc, "e2e/trust/signed:v1")
	unsigned, unsignedLayers := c.PushModel(t, genModel(t, 502, 2), "e2e/trust/unsigned:v1")
	const rule = "e2e-trust-models"
	sign := enforceSignatures(t, c, rule, c.Registry+"/e2e/trust/**")
	sign(signed)

	mark := c.Mark(t)
	const mnt = "/models/m"
	c.Apply(t, c.PodManifest(harness.PodSpec{Name: "trust-unsigned", Script: harness.SumScript(mnt),
		Volumes: []harness.Volume{{Name: "model", MountPath: mnt, CSI: map[string]string{"reference": unsigned}}}}))
	event := waitEvent(t, c, "default", "trust-unsigned", "FailedMount", regexp.MustCompile(regexp.QuoteMeta(rule)))
	t.Logf("refused as expected: %s", event)
	if pod := c.Pod(t, "default", "trust-unsigned"); !harness.NotStarted(pod) {
		t.Errorf("unsigned model's pod: want Pending in ContainerCreating, got %s %+v", pod.Status.Phase, pod.Status.ContainerStatuses)
	}
	gets := c.BlobGETs(t, mark)
	for _, l := range unsignedLayers {
		if gets[l] != 0 {
			t.Errorf("the registry served unsigned layer %s %d times before the policy refused it", l, gets[l])
		}
	}

	c.Apply(t, c.PodManifest(harness.PodSpec{Name: "trust-signed", Script: harness.SumScript(mnt),
		Volumes: []harness.Volume{{Name: "model", MountPath: mnt, CSI: map[string]string{"reference": signed}}}}))
	c.WaitPhase(t, "default", "trust-signed", corev1.PodSucceeded, podTimeout)
	if got, want := harness.ParseSums(t, c.Logs(t, "default", "trust-signed", ""), mnt), harness.TreeSums(t, signedSrc); !maps.Equal(got, want) {
		t.Errorf("signed model: the container read other bytes than the source:\ngot  %v\nwant %v", got, want)
	}
}

// enforceSignatures puts the driver under an enforce rule named rule for references matching match, trusting a
// fresh cosign key delivered as users deliver keys (the modelpack-keys Secret, mounted into the plugin), and
// restores the previous policy afterwards. It returns a signer for that key (offline: no transparency log).
func enforceSignatures(t *testing.T, c *harness.Cluster, rule, match string) (sign func(ref string)) {
	t.Helper()
	cosign := testenv.Tool(t, "cosign")
	keys := t.TempDir()
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(cosign, args...)
		cmd.Dir = keys
		cmd.Env = append(os.Environ(), "COSIGN_PASSWORD=", "DOCKER_CONFIG="+keys)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("cosign %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("generate-key-pair", "--output-key-prefix", "e2e")
	oldPolicy := c.Policy(t)
	c.Kubectl(t, "-n", harness.Namespace, "create", "secret", "generic", "modelpack-keys", "--from-file=cosign.pub="+filepath.Join(keys, "e2e.pub"))
	c.SetPolicy(t, fmt.Sprintf(`default:
  mode: enforce
  none: true
rules:
- name: %s
  match: ["%s"]
  mode: enforce
  keys: [/etc/modelpack/keys/cosign.pub]
  transparencyLog: waive
`, rule, match))
	t.Cleanup(func() {
		c.SetPolicy(t, oldPolicy)
		c.Run("-n", harness.Namespace, "delete", "secret", "modelpack-keys", "--ignore-not-found")
	})
	// The Secret was created after the plugin started: restart the plugin so its volume carries the key, as an
	// operator rolling out keys would.
	restartDriver(t, c)
	return func(ref string) {
		t.Helper()
		run("sign", "--key", filepath.Join(keys, "e2e.key"), "--tlog-upload=false", "--allow-http-registry", "--yes", ref)
	}
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i := range lines {
		lines[i] = prefix + lines[i]
	}
	return strings.Join(lines, "\n") + "\n"
}

// restartDriver deletes the node plugin's pod and waits until the DaemonSet's new one runs and the kubelet has
// registered the driver again.
func restartDriver(t *testing.T, c *harness.Cluster) {
	t.Helper()
	old := c.DriverPod(t)
	c.Kubectl(t, "-n", harness.Namespace, "delete", "pod", old, "--wait=true", "--timeout=120s")
	awaitDriver(t, c, old)
}

// awaitDriver waits until the DaemonSet has rolled out, a node plugin pod other than old runs with all its
// containers ready, and the kubelet has registered the driver again.
func awaitDriver(t *testing.T, c *harness.Cluster, old string) {
	t.Helper()
	c.Kubectl(t, "-n", harness.Namespace, "rollout", "status", "daemonset/modelpack-node", "--timeout=180s")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, _ := c.Run("-n", harness.Namespace, "get", "pods", "-l", "app.kubernetes.io/component=node",
			"-o", `jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.status.containerStatuses[*].ready}{"\n"}{end}`)
		f := strings.Fields(strings.TrimSpace(out))
		if len(f) >= 3 && f[0] != old && f[1] == "Running" && !strings.Contains(out, "false") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new node plugin pod in place of %s: %s", old, out)
		}
		time.Sleep(250 * time.Millisecond)
	}
	c.WaitDriverRegistered(t, time.Minute)
}

// waitEvent waits for an event of reason about the object whose message matches.
func waitEvent(t *testing.T, c *harness.Cluster, namespace, name, reason string, message *regexp.Regexp) string {
	t.Helper()
	deadline := time.Now().Add(podTimeout)
	for {
		var seen []string
		for _, e := range c.Events(t, namespace, name) {
			if e.Reason == reason && message.MatchString(e.Message) {
				return e.Message
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s event matching %s for %s/%s; events:\n%s", reason, message, namespace, name, strings.Join(seen, "\n"))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestPrepull: a model added to the modelpack-prepull ConfigMap is pulled onto the node by the prepull DaemonSet;
// a pod mounting it then starts without a single blob GET.
func TestPrepull(t *testing.T) {
	c := harness.Connect(t)
	src := genModel(t, 601, 2)
	ref, _ := c.PushModel(t, src, "e2e/prepull:v1")
	old := c.Kubectl(t, "-n", harness.Namespace, "get", "configmap", "modelpack-prepull", "-o", "jsonpath={.data.models\\.yaml}")
	setPrepull := func(list string) {
		t.Helper()
		cm := fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: modelpack-prepull, namespace: %s}\ndata:\n  models.yaml: |\n%s",
			harness.Namespace, indent(list, "    "))
		if _, err := c.RunInput(cm, "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
	}
	setPrepull("models:\n- " + ref + "\n")
	t.Cleanup(func() { setPrepull(old) })

	// The kubelet delivers the ConfigMap to the watcher (within its sync period); the watcher logs the model ready.
	ready := fmt.Sprintf(`"msg":"prepull ready","ref":%q`, ref)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		log, _ := c.Run("-n", harness.Namespace, "logs", "-l", "app.kubernetes.io/component=prepull", "--tail=-1")
		if strings.Contains(log, ready) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("prepull never logged %s ready:\n%s", ref, log)
		}
		time.Sleep(time.Second)
	}

	mark := c.Mark(t)
	const mnt = "/models/m"
	c.Apply(t, c.PodManifest(harness.PodSpec{Name: "prepulled", Script: harness.SumScript(mnt),
		Volumes: []harness.Volume{{Name: "model", MountPath: mnt, CSI: map[string]string{"reference": ref}}}}))
	c.WaitPhase(t, "default", "prepulled", corev1.PodSucceeded, podTimeout)
	if got, want := harness.ParseSums(t, c.Logs(t, "default", "prepulled", ""), mnt), harness.TreeSums(t, src); !maps.Equal(got, want) {
		t.Errorf("the container read other bytes than the source:\ngot  %v\nwant %v", got, want)
	}
	if gets := c.BlobGETs(t, mark); len(gets) != 0 {
		t.Errorf("a prepulled model's pod made blob GETs: %v", gets)
	}
}

// TestRestarts: while a pod reads its model, the kubelet restarts and the node plugin's pod is deleted and
// recreated; the pod keeps reading the same bytes throughout, and deleting it afterwards unpublishes cleanly.
func TestRestarts(t *testing.T) {
	c := harness.Connect(t)
	src := genModel(t, 701, 2)
	ref, _ := c.PushModel(t, src, "e2e/restarts:v1")
	want := harness.TreeSums(t, src)
	shard := "model-00001-of-00002.safetensors"
	const mnt = "/models/m"
	// Every second: hash the shard again and print a numbered line.
	script := fmt.Sprintf("i=0; while true; do i=$((i+1)); echo \"read $i $(sha256sum %s/%s | cut -d' ' -f1)\"; sleep 1; done", mnt, shard)
	c.Apply(t, c.PodManifest(harness.PodSpec{Name: "reader", Script: script,
		Volumes: []harness.Volume{{Name: "model", MountPath: mnt, CSI: map[string]string{"reference": ref}}}}))
	pod := c.WaitPhase(t, "default", "reader", corev1.PodRunning, podTimeout)

	reads := func() int {
		// The log is briefly unavailable while the kubelet restarts: count nothing then.
		log, err := c.Run("logs", "reader")
		if err != nil {
			return 0
		}
		return countReads(t, log, want[shard])
	}
	keepsReading := func(step string) {
		t.Helper()
		n := reads()
		deadline := time.Now().Add(time.Minute)
		for reads() < n+3 {
			if time.Now().After(deadline) {
				t.Fatalf("after %s the pod stopped reading its model; log:\n%s", step, c.Logs(t, "default", "reader", ""))
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	keepsReading("start")
	c.RestartKubelet(t)
	keepsReading("the kubelet restart")
	restartDriver(t, c)
	keepsReading("the node plugin's restart")
	if p := c.Pod(t, "default", "reader"); p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the model pod's container restarted %d times", p.Status.ContainerStatuses[0].RestartCount)
	}

	c.Kubectl(t, "delete", "pod", "reader", "--wait=true", "--timeout=120s")
	waitNoMounts(t, "/var/lib/kubelet/pods/"+string(pod.UID)+"/")
}

// countReads counts the log's read lines, and fails on one whose hash is not the source's.
func countReads(t *testing.T, log, want string) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(log, "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "read" {
			continue
		}
		if f[2] != want {
			t.Fatalf("read %s returned other bytes: sha256 %s, want %s", f[1], f[2], want)
		}
		n++
	}
	return n
}
