//go:build fleet

// Package cluster is the multi-node real-cluster suite: every test runs real pods on the real kubelets of the
// fleet cluster (up.sh beside this file: 3 nodes, each in its own network and mount namespace) with modelpack
// deployed from deploy/ as DaemonSets, and asserts what each container read and what the registry served.
// Run it with `make e2e-fleet`; see e2e/fleet/README.md.
package cluster

import (
	"encoding/json"
	"maps"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
	"github.com/modelpack/modelpack/internal/testmodel"
)

const podTimeout = 4 * time.Minute

// runSeed makes this run's shards differ from any earlier run's on the same cluster, whose node caches keep them.
var runSeed = uint64(time.Now().UnixNano()%(1<<30)) << 12

// model writes a fresh model (shards × size bytes) for this run into a temp dir.
func model(t *testing.T, seed uint64, shards int, size int64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Generate(dir, testmodel.Spec{Shards: shards, ShardSize: size, Seed: runSeed + seed*64, Files: 2}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// readOnEveryNode starts one pod per node, all at once, each mounting ref through its node's driver and printing
// the sha256 of every file; it waits for all of them and checks each read exactly the files of src.
func readOnEveryNode(t *testing.T, c *harness.Cluster, prefix, ref, src string) {
	t.Helper()
	const mnt = "/models/m"
	var manifests []string
	for _, n := range c.Nodes {
		manifests = append(manifests, c.PodManifest(harness.PodSpec{Name: prefix + "-" + n, Node: n, Script: harness.SumScript(mnt),
			Volumes: []harness.Volume{{Name: "model", MountPath: mnt, CSI: map[string]string{"reference": ref}}}}))
	}
	c.Apply(t, strings.Join(manifests, "---\n"))
	want := harness.TreeSums(t, src)
	for _, n := range c.Nodes {
		name := prefix + "-" + n
		p := c.WaitPhase(t, "default", name, corev1.PodSucceeded, podTimeout)
		if p.Spec.NodeName != n {
			t.Errorf("pod %s ran on %s, want %s", name, p.Spec.NodeName, n)
		}
		if got := harness.ParseSums(t, c.Logs(t, "default", name, ""), mnt); !maps.Equal(got, want) {
			t.Errorf("node %s read other bytes than the source:\ngot  %v\nwant %v", n, got, want)
		}
	}
}

// TestDaemonSetsOnEveryNode: the driver (with its registrar) and the prepull agent run on every node from the one
// DaemonSet each, every node's kubelet lists the driver, and every driver reads the same trust policy.
func TestDaemonSetsOnEveryNode(t *testing.T) {
	c := harness.Connect(t)
	if len(c.Nodes) < 3 {
		t.Fatalf("want at least 3 nodes, the cluster has %v", c.Nodes)
	}
	for _, ds := range []string{"modelpack-node", "modelpack-prepull"} {
		on := map[string]bool{}
		var pods corev1.PodList
		out := c.Kubectl(t, "-n", harness.Namespace, "get", "pods", "-l", "app.kubernetes.io/component="+strings.TrimPrefix(ds, "modelpack-"), "-o", "json")
		if err := json.Unmarshal([]byte(out), &pods); err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if ready(&p) {
				on[p.Spec.NodeName] = true
			}
		}
		for _, n := range c.Nodes {
			if !on[n] {
				t.Errorf("%s: no Ready pod on node %s", ds, n)
			}
		}
	}
	for _, n := range c.Nodes {
		if out := c.Kubectl(t, "get", "csinode", n, "-o", "jsonpath={.spec.drivers[*].name}"); !strings.Contains(out, "modelpack.csi.dev") {
			t.Errorf("node %s: kubelet lists drivers %q, no modelpack.csi.dev", n, out)
		}
		// Each driver serves its metrics on its own node's loopback (the namespace's, as on a real node).
		if m := nodeMetrics(t, c, n); !strings.Contains(m, "modelpack_") {
			t.Errorf("node %s: driver metrics empty:\n%s", n, m)
		}
	}
}

// TestModelOnEveryNode: one model pushed to the registry, a pod on each node mounting it through that node's
// driver; every pod reads exactly the source files.
func TestModelOnEveryNode(t *testing.T) {
	c := harness.Connect(t)
	src := model(t, 1, 3, 2<<20)
	ref, _ := c.PushModel(t, src, "e2e/every-node:v1")
	readOnEveryNode(t, c, "every", ref, src)
}

// nodeMetrics is the node's driver's /metrics, read inside the node's network namespace (the driver listens on
// that namespace's loopback, as on a real node).
func nodeMetrics(t *testing.T, c *harness.Cluster, node string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", node, "curl", "-sf", "http://127.0.0.1:29808/metrics").CombinedOutput()
	if err != nil {
		t.Fatalf("driver metrics on %s: %v: %s", node, err, out)
	}
	return string(out)
}

// driverPods maps each node to its driver pod.
func driverPods(t *testing.T, c *harness.Cluster) map[string]string {
	t.Helper()
	var pods corev1.PodList
	if err := json.Unmarshal([]byte(c.Kubectl(t, "-n", harness.Namespace, "get", "pods", "-l", "app.kubernetes.io/component=node", "-o", "json")), &pods); err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			m[p.Spec.NodeName] = p.Name
		}
	}
	return m
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// parallel runs f for every node at once and waits.
func parallel(nodes []string, f func(node string)) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); f(n) }()
	}
	wg.Wait()
}
