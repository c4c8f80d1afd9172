package deploy_test

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/modelpack/modelpack/cache"
	"github.com/modelpack/modelpack/internal/testenv"
)

// node.registryCredentials.secretName: one existing kubernetes.io/dockerconfigjson Secret becomes the plugin's
// --registry-config, the file the flag names being the Secret's .dockerconfigjson key; unset, none of it renders.
func TestHelmRegistryCredentials(t *testing.T) {
	objs := helm(t, "node.registryCredentials.secretName=registry-creds")
	checkInstall(t, objs)
	ps := podSpec(index(objs)["DaemonSet/modelpack-node"])
	plugin := container(ps, "modelpack")
	file := parseFlags(plugin.Args)["registry-config"]
	if file == "" {
		t.Fatalf("no --registry-config: %q", plugin.Args)
	}
	dir := path.Dir(file)
	name := mountOf(ps, plugin, dir)
	if name == "" {
		t.Fatalf("--registry-config=%s: nothing is mounted at %s: %+v", file, dir, plugin.VolumeMounts)
	}
	for _, m := range plugin.VolumeMounts {
		if m.Name == name && (!m.ReadOnly || m.SubPath != "") {
			t.Errorf("credentials mount %+v: want read-only and whole (a subPath mount never sees the Secret's updates)", m)
		}
	}
	var vol *corev1.Volume
	for i := range ps.Volumes {
		if ps.Volumes[i].Name == name {
			vol = &ps.Volumes[i]
		}
	}
	if vol == nil || vol.Secret == nil || vol.Secret.SecretName != "registry-creds" {
		t.Fatalf("volume %s: %+v, want Secret registry-creds", name, vol)
	}
	want := []corev1.KeyToPath{{Key: corev1.DockerConfigJsonKey, Path: path.Base(file)}}
	if !equality.Semantic.DeepEqual(vol.Secret.Items, want) {
		t.Errorf("Secret items %+v, want %+v (the dockerconfigjson key at the flag's file)", vol.Secret.Items, want)
	}

	ps = podSpec(index(helm(t))["DaemonSet/modelpack-node"])
	plugin = container(ps, "modelpack")
	if f, ok := parseFlags(plugin.Args)["registry-config"]; ok {
		t.Errorf("defaults pass --registry-config=%s", f)
	}
	for _, v := range ps.Volumes {
		if v.Name == name {
			t.Errorf("defaults mount the credentials volume %+v", v)
		}
	}
}

// updateStrategy: the defaults are the ones the chart always had (node one at a time, prepull Kubernetes' own);
// each is configurable, and OnDelete drops the default's rollingUpdate, which the API refuses beside it.
func TestHelmUpdateStrategy(t *testing.T) {
	strategy := func(objs []object, name string) appsv1.DaemonSetUpdateStrategy {
		t.Helper()
		ds, ok := index(objs)["DaemonSet/"+name].obj.(*appsv1.DaemonSet)
		if !ok {
			t.Fatalf("no DaemonSet %s", name)
		}
		return ds.Spec.UpdateStrategy
	}
	one, pct, zero := intstr.FromInt32(1), intstr.FromString("10%"), intstr.FromInt32(0)
	for _, c := range []struct {
		name          string
		sets          []string
		node, prepull appsv1.DaemonSetUpdateStrategy
	}{
		{"defaults", nil,
			appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType, RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: &one}},
			appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType}},
		{"OnDelete and a percentage", []string{"node.updateStrategy.type=OnDelete", "prepull.updateStrategy.rollingUpdate.maxUnavailable=10%"},
			appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType},
			appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType, RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: &pct}}},
		{"surge", []string{"node.updateStrategy.rollingUpdate.maxUnavailable=0", "node.updateStrategy.rollingUpdate.maxSurge=1"},
			appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType, RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: &zero, MaxSurge: &one}},
			appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType}},
	} {
		t.Run(c.name, func(t *testing.T) {
			objs := helm(t, c.sets...)
			if got := strategy(objs, "modelpack-node"); !equality.Semantic.DeepEqual(got, c.node) {
				t.Errorf("node updateStrategy %+v, want %+v", got, c.node)
			}
			if got := strategy(objs, "modelpack-prepull"); !equality.Semantic.DeepEqual(got, c.prepull) {
				t.Errorf("prepull updateStrategy %+v, want %+v", got, c.prepull)
			}
		})
	}
}

// The pod values every chart has, for the node plugin, the prepull and the controller, each rendered into its pod
// template; podLabels cannot move a pod out of its workload's selector.
func TestHelmPodValues(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	var doc string
	for _, w := range []string{"node", "prepull", "controller"} {
		doc += w + `:
  podAnnotations: {example.com/owner: ` + w + `-team}
  podLabels: {example.com/tier: ` + w + `, app.kubernetes.io/component: hijacked}
  nodeSelector: {example.com/pool: ` + w + `}
  tolerations: [{key: example.com/` + w + `, operator: Exists, effect: NoSchedule}]
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms: [{matchExpressions: [{key: example.com/` + w + `, operator: In, values: ["yes"]}]}]
  priorityClassName: ` + w + `-priority
  resources: {requests: {cpu: 7m, memory: 7Mi}, limits: {memory: 77Mi}}
`
	}
	if err := os.WriteFile(values, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	ix := index(helmArgs(t, "-f", values))
	for w, key := range map[string]string{"node": "DaemonSet/modelpack-node", "prepull": "DaemonSet/modelpack-prepull",
		"controller": "Deployment/modelpack-controller"} {
		o, ok := ix[key]
		if !ok {
			t.Fatalf("no %s", key)
		}
		var tmpl corev1.PodTemplateSpec
		var selector map[string]string
		switch v := o.obj.(type) {
		case *appsv1.DaemonSet:
			tmpl, selector = v.Spec.Template, v.Spec.Selector.MatchLabels
		case *appsv1.Deployment:
			tmpl, selector = v.Spec.Template, v.Spec.Selector.MatchLabels
		}
		if got := tmpl.Annotations["example.com/owner"]; got != w+"-team" {
			t.Errorf("%s podAnnotations: %v", w, tmpl.Annotations)
		}
		if w == "node" && tmpl.Annotations["checksum/mirrors"] == "" {
			t.Errorf("node podAnnotations replaced the chart's checksum/mirrors: %v", tmpl.Annotations)
		}
		if tmpl.Labels["example.com/tier"] != w {
			t.Errorf("%s podLabels: %v", w, tmpl.Labels)
		}
		for k, v := range selector {
			if tmpl.Labels[k] != v {
				t.Errorf("%s: pod label %s=%q, the selector wants %q", w, k, tmpl.Labels[k], v)
			}
		}
		ps := tmpl.Spec
		if ps.NodeSelector["example.com/pool"] != w {
			t.Errorf("%s nodeSelector: %v", w, ps.NodeSelector)
		}
		if len(ps.Tolerations) != 1 || ps.Tolerations[0].Key != "example.com/"+w || ps.Tolerations[0].Effect != corev1.TaintEffectNoSchedule {
			t.Errorf("%s tolerations: %+v", w, ps.Tolerations)
		}
		if a := ps.Affinity; a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil ||
			a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key != "example.com/"+w {
			t.Errorf("%s affinity: %+v", w, ps.Affinity)
		}
		if ps.PriorityClassName != w+"-priority" {
			t.Errorf("%s priorityClassName %q", w, ps.PriorityClassName)
		}
		c := ps.Containers[0]
		if !c.Resources.Requests.Cpu().Equal(resource.MustParse("7m")) || !c.Resources.Limits.Memory().Equal(resource.MustParse("77Mi")) {
			t.Errorf("%s container %s resources: %+v", w, c.Name, c.Resources)
		}
	}
	// The chart's own PriorityClass is for its default name only; another name is an existing class.
	if _, ok := ix["PriorityClass/modelpack-prepull"]; ok {
		t.Error("prepull.priorityClassName=prepull-priority still renders the PriorityClass modelpack-prepull")
	}
}

// watermarks reads the plugin's --cache-high-watermark and --cache-low-watermark as the driver gets them: each
// flag once, its $(VAR) resolved from the container's env.
func watermarks(t *testing.T, plugin *corev1.Container) (high, low string) {
	t.Helper()
	env := map[string]string{}
	for _, e := range plugin.Env {
		env[e.Name] = e.Value
	}
	flags := parseFlags(plugin.Args)
	resolve := func(name string) string {
		v, ok := flags[name]
		if !ok {
			t.Fatalf("plugin has no --%s: %q", name, plugin.Args)
		}
		if inner, ok := strings.CutPrefix(v, "$("); ok {
			inner = strings.TrimSuffix(inner, ")")
			if v, ok = env[inner]; !ok {
				t.Fatalf("--%s reads $(%s), which the container's env lacks", name, inner)
			}
		}
		return v
	}
	return resolve("cache-high-watermark"), resolve("cache-low-watermark")
}

// cache.highWatermark/lowWatermark become the driver's flags (kubelet's image GC defaults, 85 and 80, in the chart
// and the kustomize base alike); a pair the driver would refuse is refused at render time, naming the value.
func TestCacheWatermarks(t *testing.T) {
	for name, c := range map[string]struct {
		plugin    *corev1.Container
		high, low string
	}{
		"helm defaults":  {container(podSpec(index(helm(t))["DaemonSet/modelpack-node"]), "modelpack"), "85", "80"},
		"helm set":       {container(podSpec(index(helm(t, "cache.highWatermark=90", "cache.lowWatermark=70"))["DaemonSet/modelpack-node"]), "modelpack"), "90", "70"},
		"helm off":       {container(podSpec(index(helm(t, "cache.highWatermark=0", "cache.lowWatermark=0"))["DaemonSet/modelpack-node"]), "modelpack"), "0", "0"},
		"kustomize base": {container(podSpec(index(kustomize(t, "default"))["DaemonSet/modelpack-node"]), "modelpack"), "85", "80"},
	} {
		high, low := watermarks(t, c.plugin)
		if high != c.high || low != c.low {
			t.Errorf("%s: watermarks %s/%s, want %s/%s", name, high, low, c.high, c.low)
		}
		h, _ := strconv.Atoi(high)
		l, _ := strconv.Atoi(low)
		if err := cache.CheckWatermarks(h, l, "--cache-high-watermark", "--cache-low-watermark"); err != nil {
			t.Errorf("%s: the driver would refuse them: %v", name, err)
		}
	}
	helmBin := testenv.Tool(t, "helm")
	for set, want := range map[string]string{
		"cache.lowWatermark=85":    "cache.lowWatermark 85: want 0 to below cache.highWatermark (85)",
		"cache.highWatermark=0":    "cache.lowWatermark 80 without cache.highWatermark",
		"cache.highWatermark=101":  "/cache/highWatermark",
		"cache.lowWatermark=-1":    "/cache/lowWatermark",
		"cache.highWatermark=high": "/cache/highWatermark",
	} {
		cmd := exec.Command(helmBin, "template", "modelpack", "helm/modelpack", "--set", set)
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("--set %s: %v, want an error with %q:\n%s", set, err, want, out)
		}
	}
}
