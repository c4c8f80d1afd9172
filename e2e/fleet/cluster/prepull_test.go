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

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
	"github.com/modelpack/modelpack/internal/testenv"
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

// TestPrepullGroupOnSelectedNodes: the Helm chart's prepull.groups (one DaemonSet + ConfigMap per group, on the
// nodes its nodeSelector picks) rendered with `helm template` and applied beside the kustomize install: one node
// labelled for the group prepulls the group's model, under the group's own list on its driver, and the other
// nodes neither run the group's pod nor hold the model. Retiring the group (models: []) unpins it.
func TestPrepullGroupOnSelectedNodes(t *testing.T) {
	c := harness.Connect(t)
	src := model(t, 6, 1, 1<<20)
	ref, _ := c.PushModel(t, src, "e2e/fleet-prepull-group:v1")
	_, manifestDigest, _ := strings.Cut(ref, "@")
	const group, label = "e2e", "e2e.modelpack.dev/prepull-group"
	const groupPort = 29811 // beside the default prepull pod's 29809 on the node's loopback
	chosen := c.Nodes[1]
	c.Kubectl(t, "label", "node", chosen, label+"=yes")
	t.Cleanup(func() { c.Kubectl(t, "label", "node", chosen, label+"-") })

	render := func(models string) string {
		t.Helper()
		// The image the kustomize install runs, REPOSITORY:TAG (the registry's port holds a colon too).
		running := c.Kubectl(t, "-n", harness.Namespace, "get", "ds", "modelpack-prepull", "-o", "jsonpath={.spec.template.spec.containers[0].image}")
		i := strings.LastIndex(running, ":")
		image, tag := running[:i], running[i+1:]
		out, err := exec.Command(testenv.Tool(t, "helm"), "template", "modelpack", filepath.Join(testenv.RepoRoot(), "deploy", "helm", "modelpack"),
			"--namespace", harness.Namespace, "--set", "image.repository="+image, "--set-string", "image.tag="+tag,
			"--set", "prepull.groups[0].name="+group, "--set-string", "prepull.groups[0].nodeSelector."+strings.ReplaceAll(label, ".", `\.`)+"=yes",
			"--set-json", "prepull.groups[0].models="+models,
			"--show-only", "templates/prepull.yaml", "--show-only", "templates/configmaps.yaml").Output()
		if err != nil {
			t.Fatalf("helm template: %v", err)
		}
		// Only the group's objects: the rest of the install is the kustomize overlay's.
		var keep []string
		for _, doc := range strings.Split(string(out), "\n---\n") {
			var o struct {
				Kind     string
				Metadata struct{ Name string }
			}
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil || o.Metadata.Name != "modelpack-prepull-"+group {
				continue
			}
			if o.Kind == "DaemonSet" {
				doc = hostNetworkPrepull(t, doc, groupPort)
			}
			keep = append(keep, doc)
		}
		if len(keep) != 2 {
			t.Fatalf("helm template rendered %d objects named modelpack-prepull-%s, want a DaemonSet and a ConfigMap:\n%s", len(keep), group, out)
		}
		return strings.Join(keep, "\n---\n")
	}
	c.Apply(t, render(`["`+ref+`"]`))
	c.Kubectl(t, "-n", harness.Namespace, "rollout", "status", "ds/modelpack-prepull-"+group, "--timeout=3m")

	sel := "modelpack.dev/prepull-group=" + group
	var pods corev1.PodList
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if err := yaml.Unmarshal([]byte(c.Kubectl(t, "-n", harness.Namespace, "get", "pods", "-l", sel, "-o", "json")), &pods); err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) == 1 && ready(&pods.Items[0]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the group's pods are not one Ready pod after 3m:\n%s", c.Kubectl(t, "-n", harness.Namespace, "get", "pods", "-l", sel, "-o", "wide"))
		}
		time.Sleep(250 * time.Millisecond)
	}
	if n := pods.Items[0].Spec.NodeName; n != chosen {
		t.Fatalf("the group's pod runs on %s, want only the labelled node %s", n, chosen)
	}
	holds(t, c, chosen, manifestDigest)
	entries := func(node, list string) []prepull.Entry {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := prepull.NewClient(filepath.Join(c.Dir, "nodes", node, "kubelet", "plugins", "modelpack.csi.dev", "prepull.sock")).Entries(ctx, list, 0)
		if err != nil {
			t.Fatalf("node %s: prepull entries: %v", node, err)
		}
		return s.Entries
	}
	if es := entries(chosen, "group-"+group); len(es) != 1 || es[0].Ref != ref || es[0].State != prepull.StateReady {
		t.Errorf("node %s: list group-%s holds %+v, want %s ready", chosen, group, es, ref)
	}
	if es := entries(chosen, "configmap"); slices.ContainsFunc(es, func(e prepull.Entry) bool { return e.Ref == ref }) {
		t.Errorf("node %s: the default list holds the group's model: %+v", chosen, es)
	}
	for _, n := range c.Nodes {
		if n == chosen {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cache, err := prepull.NewClient(filepath.Join(c.Dir, "nodes", n, "kubelet", "plugins", "modelpack.csi.dev", "prepull.sock")).Cache(ctx)
		cancel()
		if err != nil {
			t.Fatalf("node %s: prepull cache: %v", n, err)
		}
		if slices.ContainsFunc(cache, func(e prepull.CacheEntry) bool { return e.Digest.String() == manifestDigest }) {
			t.Errorf("node %s is not in the group, yet its cache holds the group's model %s", n, manifestDigest)
		}
	}

	// Retire the group: models [] first (its pod unpins them), then the DaemonSet goes (Apply's cleanup).
	if _, err := c.RunInput(render("[]"), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(2 * time.Minute)
	for len(entries(chosen, "group-"+group)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("node %s still lists the group's models 2m after the group was emptied: %+v", chosen, entries(chosen, "group-"+group))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// hostNetworkPrepull makes what the fleet overlay (deploy/overlays/local-cluster) makes of the default prepull
// DaemonSet: the test cluster's kubelets cannot reach pod addresses, so the pod uses the node's network, its
// endpoints on the node's loopback at port.
func hostNetworkPrepull(t *testing.T, doc string, port int32) string {
	t.Helper()
	var ds appsv1.DaemonSet
	if err := yaml.Unmarshal([]byte(doc), &ds); err != nil {
		t.Fatal(err)
	}
	ps := &ds.Spec.Template.Spec
	ps.HostNetwork = true
	c := &ps.Containers[0]
	c.Args = append(c.Args, fmt.Sprintf("--metrics-addr=127.0.0.1:%d", port))
	c.Ports = []corev1.ContainerPort{{Name: "metrics", ContainerPort: port}}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		p.HTTPGet.Host, p.HTTPGet.Port = "127.0.0.1", intstr.FromInt32(port)
	}
	b, err := yaml.Marshal(&ds)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
