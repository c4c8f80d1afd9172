package deploy_test

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/modelpack/modelpack/internal/testenv"
)

// TestP2PKraken holds both installs of the Kraken component to what makes it work on a real fleet: the driver on
// the host network reads every registry through the agent on its own node (the port the agent serves its registry
// API on, which admits only 127.0.0.1), the agent's admin port is node-local, and the origin and build-index reach
// the user's registry through the Accept-header proxy beside them.
func TestP2PKraken(t *testing.T) {
	for name, objs := range map[string]func() []object{
		"kustomize": func() []object { return kustomize(t, "p2p-kraken") },
		"helm":      func() []object { return helm(t, krakenSets...) },
	} {
		t.Run(name, func(t *testing.T) {
			objs := objs()
			checkInstall(t, objs)
			checkKraken(t, index(objs), []string{"10.0.0.0/16"})
		})
	}
	// Kraken authenticates nobody: the chart refuses to install it without the nodes' CIDRs, and admits each.
	if out, err := helmErr(t, "p2p.kraken.enabled=true", "p2p.kraken.registry=registry.example.com"); err == nil || !strings.Contains(out, "p2p.kraken.nodeCIDRs") {
		t.Errorf("the chart installed Kraken without p2p.kraken.nodeCIDRs (%v):\n%s", err, out)
	}
	checkKraken(t, index(helm(t, "p2p.kraken.enabled=true", "p2p.kraken.registry=registry.example.com",
		"p2p.kraken.nodeCIDRs={10.1.0.0/16,192.168.7.0/24}")), []string{"10.1.0.0/16", "192.168.7.0/24"})
}

// krakenSets install the chart as deploy/overlays/p2p-kraken is.
var krakenSets = []string{"p2p.kraken.enabled=true", "p2p.kraken.registry=registry.example.com", "p2p.kraken.nodeCIDRs={10.0.0.0/16}"}

// fleetOnly fails the test unless from admits exactly Kraken's own pods and the nodes' CIDRs.
func fleetOnly(t *testing.T, what string, from []networkingv1.NetworkPolicyPeer, nodes []string) {
	t.Helper()
	var cidrs []string
	pods := false
	for _, f := range from {
		switch {
		case f.IPBlock != nil && len(f.IPBlock.Except) == 0:
			cidrs = append(cidrs, f.IPBlock.CIDR)
		case f.PodSelector != nil && f.NamespaceSelector == nil && len(f.PodSelector.MatchLabels) == 1 && f.PodSelector.MatchLabels["app.kubernetes.io/name"] == "kraken":
			pods = true
		default:
			t.Errorf("%s admitted from %+v: only the nodes and Kraken's pods may reach it", what, f)
		}
	}
	if !pods || !slices.Equal(cidrs, nodes) {
		t.Errorf("%s admitted from nodes %v and Kraken's pods %v, want nodes %v and Kraken's pods", what, cidrs, pods, nodes)
	}
}

func checkKraken(t *testing.T, ix map[string]object, nodes []string) {
	t.Helper()
	node := podSpec(ix["DaemonSet/modelpack-node"])
	if !node.HostNetwork || node.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("driver: hostNetwork %v, dnsPolicy %q: the node-local agent is the node's 127.0.0.1", node.HostNetwork, node.DNSPolicy)
	}
	plugin := container(node, "modelpack")
	dir := parseFlags(plugin.Args)["hosts-dir"]
	var vol *corev1.Volume
	for _, m := range plugin.VolumeMounts {
		if m.MountPath == dir {
			vol = volume(node, m.Name)
		}
	}
	if dir == "" || vol == nil || vol.ConfigMap == nil || len(vol.ConfigMap.Items) != 1 || vol.ConfigMap.Items[0].Path != "_default/hosts.toml" {
		t.Fatalf("--hosts-dir %q is not a mounted _default/hosts.toml: %+v", dir, vol)
	}
	cm := ix["ConfigMap/"+vol.ConfigMap.Name].obj.(*corev1.ConfigMap)
	var hosts struct {
		Server string `toml:"server"`
		Host   map[string]struct {
			Capabilities []string `toml:"capabilities"`
		} `toml:"host"`
	}
	if _, err := toml.Decode(cm.Data[vol.ConfigMap.Items[0].Key], &hosts); err != nil {
		t.Fatalf("hosts.toml: %v", err)
	}
	if hosts.Server != "" {
		t.Errorf("hosts.toml server = %q: the fallback must be each reference's own registry", hosts.Server)
	}

	agent := ix["DaemonSet/kraken-agent"].obj.(*appsv1.DaemonSet).Spec.Template.Spec
	if !agent.HostNetwork {
		t.Error("kraken-agent: not on the host network")
	}
	flags := parseFlags(agent.Containers[0].Command)
	mirror := "http://127.0.0.1:" + flags["agent-registry-port"]
	if h, ok := hosts.Host[mirror]; !ok || !slices.Equal(h.Capabilities, []string{"pull"}) || len(hosts.Host) != 1 {
		t.Errorf("hosts.toml hosts %+v, want only %s with [pull]", hosts.Host, mirror)
	}
	var agentCfg struct {
		AllowedCIDRs []string `json:"allowed_cidrs"`
	}
	kcfg := ix["ConfigMap/kraken-config"].obj.(*corev1.ConfigMap)
	if err := yaml.Unmarshal([]byte(kcfg.Data["agent.yaml"]), &agentCfg); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(agentCfg.AllowedCIDRs, []string{"127.0.0.1"}) {
		t.Errorf("agent allowed_cidrs %v: only the node itself may pull through its agent", agentCfg.AllowedCIDRs)
	}

	// The admin port is reachable only from the node; the peer port from everywhere.
	np := ix["NetworkPolicy/kraken-agent-admin-node-local"].obj.(*networkingv1.NetworkPolicy)
	admin, peer := flags["agent-server-port"], flags["peer-port"]
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			switch p.Port.String() {
			case admin:
				if len(rule.From) != 1 || rule.From[0].IPBlock == nil || rule.From[0].IPBlock.CIDR != "127.0.0.1/32" {
					t.Errorf("admin port %s admitted from %+v", admin, rule.From)
				}
			case peer:
				fleetOnly(t, "agent peer port "+peer, rule.From, nodes)
			}
		}
	}
	if !slices.ContainsFunc(np.Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool {
		return slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port.String() == admin })
	}) {
		t.Errorf("NetworkPolicy does not name the admin port %s", admin)
	}

	// The origin, the tracker and the build-index serve any blob to whoever asks: the fleet's alone.
	cluster := ix["NetworkPolicy/kraken-cluster-fleet-only"].obj.(*networkingv1.NetworkPolicy)
	if len(cluster.Spec.Ingress) != 1 || len(cluster.Spec.Ingress[0].Ports) != 0 {
		t.Errorf("kraken-cluster-fleet-only: ingress %+v, want one rule for every port", cluster.Spec.Ingress)
	} else {
		fleetOnly(t, "origin, tracker and build-index", cluster.Spec.Ingress[0].From, nodes)
	}
	for _, key := range []string{"StatefulSet/kraken-origin", "Deployment/kraken-tracker", "Deployment/kraken-build-index"} {
		sel, err := metav1.LabelSelectorAsSelector(&cluster.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(podLabels(ix[key]))) {
			t.Errorf("kraken-cluster-fleet-only does not select %s's pods (%v)", key, err)
		}
	}
	// The agent's store, every tenant's blobs, is root's alone before the agent writes to it.
	if cmd := strings.Join(agent.Containers[0].Command, " "); !strings.Contains(cmd, "chmod 0700 /var/lib/kraken-agent && exec /usr/bin/kraken-agent") {
		t.Errorf("kraken-agent does not close its store before it starts: %s", cmd)
	}

	// The origin and the build-index talk to the registry only through the Accept-header proxy in their pod.
	for _, f := range []string{"origin.yaml", "build-index.yaml"} {
		if !strings.Contains(kcfg.Data[f], "address: 127.0.0.1:5001") {
			t.Errorf("%s: the registry backend is not the Accept-header proxy 127.0.0.1:5001", f)
		}
	}
	if !strings.Contains(kcfg.Data["accept-proxy.conf"], "listen 127.0.0.1:5001;") || kcfg.Data["registry"] != "registry.example.com" {
		t.Errorf("accept proxy: listen or registry %q wrong", kcfg.Data["registry"])
	}
	for _, key := range []string{"StatefulSet/kraken-origin", "Deployment/kraken-build-index"} {
		ps := podSpec(ix[key])
		if ps == nil || container(ps, "accept-proxy") == nil {
			t.Errorf("%s has no accept-proxy container", key)
		}
	}
}

func volume(ps *corev1.PodSpec, name string) *corev1.Volume {
	for i := range ps.Volumes {
		if ps.Volumes[i].Name == name {
			return &ps.Volumes[i]
		}
	}
	return nil
}

// Helm reads no file outside its chart (and a chart's symbolic links break when it is packaged or vendored as a
// subchart), so the chart carries a copy of the component's objects and configs; the copy must be exact, or the
// two installs drift apart.
func TestHelmKrakenFilesMatchTheComponent(t *testing.T) {
	component, chart := "components/p2p-kraken", "helm/modelpack/files/p2p-kraken"
	list := func(root string) map[string][]byte {
		files := map[string][]byte{}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			if d.Type()&fs.ModeSymlink != 0 {
				return fmt.Errorf("%s is a symbolic link", p)
			}
			rel, _ := filepath.Rel(root, p)
			if rel == "kustomization.yaml" { // kustomize's own, not an object of the component
				return nil
			}
			b, err := os.ReadFile(p)
			files[rel] = b
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	want, got := list(component), list(chart)
	if len(want) == 0 {
		t.Fatalf("%s holds no files", component)
	}
	for name, b := range want {
		if c, ok := got[name]; !ok {
			t.Errorf("%s/%s is missing: copy %s/%s there", chart, name, component, name)
		} else if !bytes.Equal(c, b) {
			t.Errorf("%s/%s differs from %s/%s: copy it again", chart, name, component, name)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s/%s has no counterpart in %s", chart, name, component)
		}
	}
}

// podLabels are the labels of the pods a workload makes.
func podLabels(o object) map[string]string {
	switch v := o.obj.(type) {
	case *appsv1.DaemonSet:
		return v.Spec.Template.Labels
	case *appsv1.Deployment:
		return v.Spec.Template.Labels
	case *appsv1.StatefulSet:
		return v.Spec.Template.Labels
	}
	return nil
}

// helmErr renders the chart and returns helm's output and error, for values it must refuse.
func helmErr(t *testing.T, sets ...string) (string, error) {
	t.Helper()
	args := []string{"template", "modelpack", "helm/modelpack", "--namespace", "modelpack"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, err := exec.Command(testenv.Tool(t, "helm"), args...).CombinedOutput()
	return string(out), err
}
