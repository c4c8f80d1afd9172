//go:build fleet

package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
)

// TestInferenceOnEveryNode runs the single-node suite's inference check (e2e/cluster TestInferenceOCR, the same
// harness.OCR fixture) on every node at once: Debian's tesseract with its English model packed as a modelpack
// artifact, mounted through each node's driver (the blobs through Kraken), must read the PNG we render exactly
// as the same program with the model from disk reads it on the host. The registry serves about one copy.
func TestInferenceOnEveryNode(t *testing.T) {
	c := harness.Connect(t)
	ocr := harness.NewOCR(t)
	// A file unique to this run makes the model cold on every node even on a cluster an earlier run warmed; the
	// traineddata blob itself may be warm then, which the copies check below tolerates (0 copies ≤ 1.1).
	if err := os.WriteFile(filepath.Join(ocr.ModelDir, "RUN"), []byte(fmt.Sprint(runSeed)), 0o644); err != nil {
		t.Fatal(err)
	}
	ref, _ := c.PushModel(t, ocr.ModelDir, "e2e/fleet-tesseract-eng:5")
	total, digests := modelBytes(t, c, "e2e/fleet-tesseract-eng", "5")
	allowOnEveryNode(t, c, harness.OCRPolicy(c.Registry+"/e2e/fleet-tesseract-eng"))

	c.Apply(t, ocr.InputConfigMap("default", "fleet-ocr-input"))
	mark := c.Mark(t)
	var pods []string
	for _, n := range c.Nodes {
		pods = append(pods, c.OCRPod("ocr-"+n, n, ref, "fleet-ocr-input"))
	}
	c.Apply(t, strings.Join(pods, "---\n"))
	for _, n := range c.Nodes {
		name := "ocr-" + n
		p := c.WaitPhase(t, "default", name, corev1.PodSucceeded, podTimeout)
		if p.Spec.NodeName != n {
			t.Errorf("pod %s ran on %s, want %s", name, p.Spec.NodeName, n)
		}
		if got := c.Logs(t, "default", name, "c"); got != ocr.Baseline {
			t.Errorf("node %s: tesseract with the model its driver mounted read %q; from disk it read %q", n, got, ocr.Baseline)
		}
	}
	n, served := copies(t, c, mark, digests, total)
	t.Logf("%d nodes ran tesseract on a %d-byte model; the registry served %.2f copies", len(c.Nodes), total, n)
	if n > 1.1 {
		t.Errorf("the registry served %.2f copies of the model to %d nodes, want ≤ 1.1: %s", n, len(c.Nodes), describe(served, digests))
	}
}

// allowOnEveryNode puts policy in force on every node's driver for the test and restores the old one after. The
// drivers reload the mounted policy on change (no restart): each driver's log gains a "policy reloaded" line once
// the kubelet has delivered the ConfigMap, which is what this waits for, node by node.
func allowOnEveryNode(t *testing.T, c *harness.Cluster, policy string) {
	t.Helper()
	set := func(p string) {
		t.Helper()
		if strings.TrimSpace(c.Policy(t)) == strings.TrimSpace(p) {
			return
		}
		before := map[string]int{}
		pods := driverPods(t, c)
		for n, pod := range pods {
			before[n] = strings.Count(c.Logs(t, harness.Namespace, pod, "modelpack"), "policy reloaded")
		}
		c.SetPolicy(t, p)
		deadline := time.Now().Add(2 * time.Minute)
		for n, pod := range pods {
			for strings.Count(c.Logs(t, harness.Namespace, pod, "modelpack"), "policy reloaded") <= before[n] {
				if time.Now().After(deadline) {
					t.Fatalf("node %s: driver %s has not reloaded the policy after 2m", n, pod)
				}
				time.Sleep(250 * time.Millisecond)
			}
		}
	}
	old := c.Policy(t)
	set(policy)
	t.Cleanup(func() { set(old) })
}

// prepullPods maps each node to its prepull pod.
func prepullPods(t *testing.T, c *harness.Cluster) map[string]corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := json.Unmarshal([]byte(c.Kubectl(t, "-n", harness.Namespace, "get", "pods", "-l", "app.kubernetes.io/component=prepull", "-o", "json")), &pods); err != nil {
		t.Fatal(err)
	}
	m := map[string]corev1.Pod{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			m[p.Spec.NodeName] = p
		}
	}
	return m
}
