//go:build fleet

package cluster

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
	"github.com/modelpack/modelpack/prepull"
	"sigs.k8s.io/yaml"
)

// prepullAddr is where the fleet overlay's prepull pods serve /metrics and /readyz: host network, the node's
// loopback.
const prepullAddr = "127.0.0.1:29809"

// TestPrepullFleetStatus: an operator adds a model to the prepull ConfigMap; every node pulls and pins it, the
// registry serves about one copy (Kraken), and the fleet's answer to "which nodes hold it" is the prepull pods'
// readiness: `kubectl rollout status` returns and every pod is Ready once every node holds it. A reference that
// does not exist makes every prepull pod NotReady, its /readyz and its log name the reference and the reason;
// removing it makes them Ready again. The prepull pods have no API access: all of this is the kubelet's probe
// of a node-local endpoint.
func TestPrepullFleetStatus(t *testing.T) {
	c := harness.Connect(t)
	src := model(t, 5, 2, 2<<20)
	ref, _ := c.PushModel(t, src, "e2e/fleet-prepull:v1")
	total, digests := modelBytes(t, c, "e2e/fleet-prepull", "v1")
	_, manifestDigest, _ := strings.Cut(ref, "@")

	old := c.Kubectl(t, "-n", harness.Namespace, "get", "configmap", "modelpack-prepull", "-o", "jsonpath={.data.models\\.yaml}")
	var oldList struct{ Models []string }
	if err := yaml.Unmarshal([]byte(old), &oldList); err != nil {
		t.Fatalf("the prepull ConfigMap's models.yaml: %v", err)
	}
	t.Cleanup(func() {
		setPrepullList(t, c, old)
		waitPrepull(t, c, "the list restored", func(_ string, ready bool, why string) bool {
			return ready && why == fmt.Sprintf("all %d models ready", len(oldList.Models))
		})
	})

	mark := c.Mark(t)
	setPrepullList(t, c, "models:\n- "+ref+"\n")
	waitPrepull(t, c, "the model added", func(_ string, ready bool, why string) bool {
		return ready && why == "all 1 models ready"
	})
	c.Kubectl(t, "-n", harness.Namespace, "rollout", "status", "ds/modelpack-prepull", "--timeout=2m")
	for node, p := range prepullPods(t, c) {
		if !ready(&p) {
			t.Errorf("node %s: prepull pod %s not Ready with every model on the node", node, p.Name)
		}
	}
	for _, node := range c.Nodes {
		holds(t, c, node, manifestDigest)
	}
	n, served := copies(t, c, mark, digests, total)
	t.Logf("%d nodes prepulled %d bytes each; the registry served %.2f copies", len(c.Nodes), total, n)
	if n > 1.1 {
		t.Errorf("the registry served %.2f copies of the prepulled model to %d nodes, want ≤ 1.1: %s", n, len(c.Nodes), describe(served, digests))
	}

	// A reference that does not exist: every node fails it, and says so.
	missing := c.Registry + "/e2e/fleet-prepull-missing:v1"
	setPrepullList(t, c, fmt.Sprintf("models:\n- %s\n- %s\n", ref, missing))
	waitPrepull(t, c, "a missing model added", func(_ string, ready bool, why string) bool {
		return !ready && strings.Contains(why, missing+": failed: ")
	})
	for node, p := range waitPods(t, c, "NotReady", func(p *corev1.Pod) bool { return !ready(p) }) {
		log := c.Logs(t, harness.Namespace, p.Name, "prepull")
		line := ""
		for l := range strings.Lines(log) {
			if strings.Contains(l, "prepull failed") && strings.Contains(l, missing) {
				line = l
			}
		}
		if line == "" || !strings.Contains(line, "reason") {
			t.Errorf("node %s: prepull pod %s's log has no failure line naming %s with its reason:\n%s", node, p.Name, missing, log)
		} else {
			t.Logf("node %s: %s", node, strings.TrimSpace(line))
		}
		holds(t, c, node, manifestDigest)
	}
	if _, err := c.Run("-n", harness.Namespace, "rollout", "status", "ds/modelpack-prepull", "--timeout=1s"); err == nil {
		t.Errorf("kubectl rollout status succeeded while every node fails a listed model")
	}

	// The operator removes it: Ready again everywhere, the good model still held.
	setPrepullList(t, c, "models:\n- "+ref+"\n")
	waitPrepull(t, c, "the missing model removed", func(_ string, ready bool, why string) bool {
		return ready && why == "all 1 models ready"
	})
	waitPods(t, c, "Ready", ready)
	c.Kubectl(t, "-n", harness.Namespace, "rollout", "status", "ds/modelpack-prepull", "--timeout=2m")
}

// setPrepullList makes the prepull ConfigMap's models.yaml list (as an operator edits it).
func setPrepullList(t *testing.T, c *harness.Cluster, list string) {
	t.Helper()
	var b strings.Builder
	for l := range strings.Lines(strings.TrimRight(list, "\n") + "\n") {
		b.WriteString("    " + l)
	}
	cm := fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: modelpack-prepull, namespace: %s}\ndata:\n  models.yaml: |\n%s", harness.Namespace, b.String())
	if _, err := c.RunInput(cm, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

// readyz is a node's prepull pod's readiness endpoint, read inside the node's network namespace.
func readyz(node string) (bool, string, error) {
	out, err := exec.Command("ip", "netns", "exec", node, "curl", "-s", "-w", "\n%{http_code}", "http://"+prepullAddr+"/readyz").Output()
	if err != nil {
		return false, "", fmt.Errorf("node %s: /readyz: %w", node, err)
	}
	s := strings.TrimSpace(string(out))
	i := strings.LastIndex(s, "\n")
	body, code := s[:max(i, 0)], s[i+1:]
	return code == "200", strings.TrimSpace(body), nil
}

// waitPrepull waits until every node's /readyz satisfies done (what the kubelet's probe reads).
func waitPrepull(t *testing.T, c *harness.Cluster, what string, done func(node string, ready bool, why string) bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for _, n := range c.Nodes {
		for {
			ok, why, err := readyz(n)
			if err == nil && done(n, ok, why) {
				t.Logf("%s: node %s: /readyz %v: %s", what, n, ok, why)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: node %s's prepull never got there: /readyz ready=%v %q (%v)", what, n, ok, why, err)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
}

// waitPods waits until every node's prepull pod satisfies done (the kubelet's view: its probe runs every 5 s).
func waitPods(t *testing.T, c *harness.Cluster, what string, done func(*corev1.Pod) bool) map[string]corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pods := prepullPods(t, c)
		all := len(pods) == len(c.Nodes)
		for _, p := range pods {
			all = all && done(&p)
		}
		if all {
			return pods
		}
		if time.Now().After(deadline) {
			t.Fatalf("prepull pods not all %s after 2m:\n%s", what, c.Kubectl(t, "-n", harness.Namespace, "get", "pods", "-l", "app.kubernetes.io/component=prepull", "-o", "wide"))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// holds checks, through the node's prepull socket (as `modelpack prepull cache` does), that the node's cache
// holds the model complete and pinned.
func holds(t *testing.T, c *harness.Cluster, node, manifestDigest string) {
	t.Helper()
	sock := filepath.Join(c.Dir, "nodes", node, "kubelet", "plugins", "modelpack.csi.dev", "prepull.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	entries, err := prepull.NewClient(sock).Cache(ctx)
	if err != nil {
		t.Fatalf("node %s: prepull cache: %v", node, err)
	}
	i := slices.IndexFunc(entries, func(e prepull.CacheEntry) bool { return e.Digest.String() == manifestDigest })
	switch {
	case i < 0:
		t.Errorf("node %s: the cache has no entry for %s: %+v", node, manifestDigest, entries)
	case !entries[i].Complete:
		t.Errorf("node %s: the cache's %s is not complete: %+v", node, manifestDigest, entries[i])
	case !slices.ContainsFunc(entries[i].Owners, func(o string) bool { return strings.HasPrefix(o, "pin:") }):
		t.Errorf("node %s: the cache's %s is not pinned: owners %v", node, manifestDigest, entries[i].Owners)
	}
}
