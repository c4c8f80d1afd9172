package deploy_test

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// prepull.groups: each group renders a DaemonSet + ConfigMap of its own, on the nodes its nodeSelector picks
// (merged over prepull.nodeSelector), with a list name of its own on the node plugin, a selector that neither the
// default prepull DaemonSet nor another group's matches, and the same least privilege (no token, no RBAC).
func TestHelmPrepullGroups(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`prepull:
  models: [registry.example.com/models/small:1]
  groups:
  - name: gpu
    nodeSelector: {example.com/gpu: "true"}
    models: [registry.example.com/models/big@sha256:0123, registry.example.com/models/bigger:2]
  - name: arm
    nodeSelector: {kubernetes.io/arch: arm64}
    tolerations: [{key: example.com/arm, operator: Exists}]
    models: [registry.example.com/models/tiny:1]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	ix := index(helmArgs(t, "-f", values))
	def, ok := ix["DaemonSet/modelpack-prepull"].obj.(*appsv1.DaemonSet)
	if !ok {
		t.Fatal("no DaemonSet/modelpack-prepull")
	}
	if args := container(&def.Spec.Template.Spec, "prepull").Args; slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--list") }) {
		t.Errorf("the default prepull DaemonSet names a list (%v): it must keep the driver's \"configmap\" list", args)
	}
	want := map[string]struct {
		nodeSelector map[string]string
		toleration   string
		models       []string
	}{
		"gpu": {map[string]string{"kubernetes.io/os": "linux", "example.com/gpu": "true"}, "", []string{"registry.example.com/models/big@sha256:0123", "registry.example.com/models/bigger:2"}},
		"arm": {map[string]string{"kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64"}, "example.com/arm", []string{"registry.example.com/models/tiny:1"}},
	}
	selectors := map[string]labels.Selector{"default": labels.SelectorFromSet(def.Spec.Selector.MatchLabels)}
	pods := map[string]labels.Set{"default": def.Spec.Template.Labels}
	for name, w := range want {
		o, ok := ix["DaemonSet/modelpack-prepull-"+name]
		if !ok {
			t.Fatalf("no DaemonSet/modelpack-prepull-%s", name)
		}
		ds := o.obj.(*appsv1.DaemonSet)
		ps := &ds.Spec.Template.Spec
		selectors[name], pods[name] = labels.SelectorFromSet(ds.Spec.Selector.MatchLabels), ds.Spec.Template.Labels
		if got := ds.Spec.Template.Labels["modelpack.dev/prepull-group"]; got != name {
			t.Errorf("%s: pod label modelpack.dev/prepull-group=%q", name, got)
		}
		if !maps.Equal(ps.NodeSelector, w.nodeSelector) {
			t.Errorf("%s: nodeSelector %v, want %v", name, ps.NodeSelector, w.nodeSelector)
		}
		if w.toleration == "" {
			if !equalTolerations(ps.Tolerations, def.Spec.Template.Spec.Tolerations) {
				t.Errorf("%s: tolerations %+v, want prepull.tolerations %+v", name, ps.Tolerations, def.Spec.Template.Spec.Tolerations)
			}
		} else if len(ps.Tolerations) != 1 || ps.Tolerations[0].Key != w.toleration {
			t.Errorf("%s: tolerations %+v, want the group's %s", name, ps.Tolerations, w.toleration)
		}
		if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken || ps.ServiceAccountName != "modelpack-prepull" {
			t.Errorf("%s: service account %q, automount %v: want modelpack-prepull without a token", name, ps.ServiceAccountName, ps.AutomountServiceAccountToken)
		}
		c := container(ps, "prepull")
		if !slices.Contains(c.Args, "--list=group-"+name) || !slices.Contains(c.Args, "--watch=/etc/modelpack/prepull/models.yaml") {
			t.Errorf("%s: args %v, want --list=group-%s and the mounted list", name, c.Args, name)
		}
		if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
			t.Errorf("%s: readiness probe %+v, want /readyz", name, c.ReadinessProbe)
		}
		var cmName string
		for _, v := range ps.Volumes {
			if v.Name == "list" && v.ConfigMap != nil {
				cmName = v.ConfigMap.Name
			}
		}
		if cmName != "modelpack-prepull-"+name {
			t.Errorf("%s: list volume from ConfigMap %q, want modelpack-prepull-%s", name, cmName, name)
		}
		cm, ok := ix["ConfigMap/"+cmName].obj.(*corev1.ConfigMap)
		if !ok {
			t.Fatalf("no ConfigMap/%s", cmName)
		}
		var list struct{ Models []string }
		if err := yaml.Unmarshal([]byte(cm.Data["models.yaml"]), &list); err != nil {
			t.Fatalf("ConfigMap/%s models.yaml: %v", cmName, err)
		}
		if !slices.Equal(list.Models, w.models) {
			t.Errorf("ConfigMap/%s lists %v, want %v", cmName, list.Models, w.models)
		}
	}
	// No DaemonSet's selector matches another's pods: overlapping selectors make controllers fight over pods.
	for s, sel := range selectors {
		for p, l := range pods {
			if s != p && sel.Matches(l) {
				t.Errorf("DaemonSet %s's selector %s matches %s's pods %v", s, sel, p, l)
			}
		}
	}

	for _, c := range []struct {
		sets []string
		want string
	}{
		{[]string{"prepull.groups[0].name=gpu", "prepull.groups[0].models={r/m:1}"}, "nodeSelector"},
		{[]string{"prepull.groups[0].name=gpu", "prepull.groups[0].nodeSelector.a=b"}, "models"},
		{[]string{"prepull.groups[0].name=gpu", "prepull.groups[0].nodeSelector.a=b", "prepull.groups[0].models[0]=has space"}, "models"},
		{[]string{"prepull.groups[0].name=GPU", "prepull.groups[0].nodeSelector.a=b", "prepull.groups[0].models={r/m:1}"}, "name"},
		{[]string{"prepull.groups[0].name=gpu", "prepull.groups[0].nodeSelector.a=b", "prepull.groups[0].models={r/m:1}",
			"prepull.groups[1].name=gpu", "prepull.groups[1].nodeSelector.a=c", "prepull.groups[1].models={r/m:2}"}, `name "gpu" appears twice`},
	} {
		out, err := helmErr(t, c.sets...)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("helm template --set %v: err %v, want a refusal naming %q:\n%s", c.sets, err, c.want, out)
		}
	}
}

func equalTolerations(a, b []corev1.Toleration) bool {
	return slices.EqualFunc(a, b, func(x, y corev1.Toleration) bool { return x == y })
}
