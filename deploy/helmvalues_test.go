package deploy_test

import (
	"os"
	"path"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
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
