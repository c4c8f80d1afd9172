package deploy_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	humanize "github.com/dustin/go-humanize"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/diff"
	"oras.land/oras-go/v2/registry"
	"sigs.k8s.io/yaml"

	"github.com/modelpack/modelpack/cli"
	"github.com/modelpack/modelpack/csidriver/access"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/prepull"
	"github.com/modelpack/modelpack/signing"
)

// newObject maps every kind the manifests may contain to its Go type; any other kind fails the test.
var newObject = map[string]func() any{
	"v1/Namespace":                            func() any { return &corev1.Namespace{} },
	"v1/ServiceAccount":                       func() any { return &corev1.ServiceAccount{} },
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"scheduling.k8s.io/v1/PriorityClass":      func() any { return &schedulingv1.PriorityClass{} },
	"monitoring.coreos.com/v1/PodMonitor":     func() any { return &unstructured.Unstructured{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &unstructured.Unstructured{} },
	"v1/Pod":                                          func() any { return &corev1.Pod{} },
	"v1/PersistentVolume":                             func() any { return &corev1.PersistentVolume{} },
	"v1/PersistentVolumeClaim":                        func() any { return &corev1.PersistentVolumeClaim{} },
	"apps/v1/DaemonSet":                               func() any { return &appsv1.DaemonSet{} },
	"apps/v1/Deployment":                              func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                             func() any { return &appsv1.StatefulSet{} },
	"networking.k8s.io/v1/NetworkPolicy":              func() any { return &networkingv1.NetworkPolicy{} },
	"storage.k8s.io/v1/CSIDriver":                     func() any { return &storagev1.CSIDriver{} },
	"storage.k8s.io/v1/StorageClass":                  func() any { return &storagev1.StorageClass{} },
	"rbac.authorization.k8s.io/v1/ClusterRole":        func() any { return &rbacv1.ClusterRole{} },
	"rbac.authorization.k8s.io/v1/ClusterRoleBinding": func() any { return &rbacv1.ClusterRoleBinding{} },
	"rbac.authorization.k8s.io/v1/Role":               func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding":        func() any { return &rbacv1.RoleBinding{} },
	"admissionregistration.k8s.io/v1/MutatingAdmissionPolicy": func() any {
		return &admissionregistrationv1.MutatingAdmissionPolicy{}
	},
	"admissionregistration.k8s.io/v1/MutatingAdmissionPolicyBinding": func() any {
		return &admissionregistrationv1.MutatingAdmissionPolicyBinding{}
	},
}

type object struct {
	kind, name, namespace string
	obj                   any
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decode splits a multi-document YAML stream and decodes each document strictly into its k8s.io/api type.
func decode(t *testing.T, src string, data []byte) []object {
	t.Helper()
	var out []object
	for i, doc := range docSep.Split(string(data), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("%s: document %d: %v", src, i, err)
		}
		mk, ok := newObject[tm.APIVersion+"/"+tm.Kind]
		if !ok {
			t.Fatalf("%s: document %d: unexpected kind %s/%s", src, i, tm.APIVersion, tm.Kind)
		}
		obj := mk()
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s: %s (document %d) does not decode strictly: %v", src, tm.Kind, i, err)
		}
		meta := obj.(metav1.Object)
		if meta.GetName() == "" {
			t.Fatalf("%s: %s (document %d) has no name", src, tm.Kind, i)
		}
		out = append(out, object{kind: tm.Kind, name: meta.GetName(), namespace: meta.GetNamespace(), obj: obj})
	}
	if len(out) == 0 {
		t.Fatalf("%s: no objects", src)
	}
	return out
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	home := t.TempDir()
	// helm keeps caches under $HOME; a test must not touch the user's.
	cmd.Env = append(os.Environ(), "HOME="+home, "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, stderr.String())
	}
	return out
}

func kustomize(t *testing.T, overlay string) []object {
	t.Helper()
	return decode(t, "overlays/"+overlay, run(t, testenv.Tool(t, "kustomize"), "build", filepath.Join("overlays", overlay)))
}

func helm(t *testing.T, sets ...string) []object {
	t.Helper()
	var args []string
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return helmArgs(t, args...)
}

// helmArgs renders the chart into the modelpack namespace with any helm template flags (--set-string, -f, ...).
func helmArgs(t *testing.T, flags ...string) []object {
	t.Helper()
	args := append([]string{"template", "modelpack", "helm/modelpack", "--namespace", "modelpack"}, flags...)
	return decode(t, "helm "+strings.Join(flags, " "), run(t, testenv.Tool(t, "helm"), args...))
}

func TestKustomizeOverlays(t *testing.T) {
	entries, err := os.ReadDir("overlays")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Run(e.Name(), func(t *testing.T) { checkInstall(t, kustomize(t, e.Name())) })
	}
}

// The production overlay sets the cache size once, through the env value the flag reads.
func TestProductionCacheSize(t *testing.T) {
	plugin := container(podSpec(index(kustomize(t, "production"))["DaemonSet/modelpack-node"]), "modelpack")
	for _, e := range plugin.Env {
		if e.Name == "CACHE_MAX_SIZE" && e.Value == "800GiB" {
			return
		}
	}
	t.Errorf("production CACHE_MAX_SIZE: %+v", plugin.Env)
}

func TestHelmChart(t *testing.T) {
	for name, sets := range map[string][]string{
		"defaults": nil,
		"everything": {
			`mirrors.docker\.io[0]=https://mirror.gcr.io`, `mirrors._default[0]=http://spegel.spegel.svc:5000`,
			"policy.keysSecret=modelpack-keys", "prepull.bandwidth=200MiB", "prepull.models[0]=registry.example.com/m/a:1",
			"cache.maxSize=500GiB", "plainHTTPRegistries[0]=registry.local:5000", "image.digest=sha256:" + strings.Repeat("a", 64),
			"kubeletDir=/var/snap/microk8s/common/var/lib/kubelet", "driverName=models.example.com",
			"metrics.podMonitor.enabled=true", "metrics.serviceMonitor.enabled=true",
			"sidecars.registrar.image=registry.k8s.io/sig-storage/csi-node-driver-registrar@sha256:" + strings.Repeat("b", 64),
			"nativeVolumes.enabled=true", "nativeVolumes.prefixes[0]=registry.example.com/models",
		},
		"minimal": {"prepull.enabled=false", "controller.enabled=false", "policy.existingConfigMap=site-policy"},
	} {
		t.Run(name, func(t *testing.T) {
			objs := helm(t, sets...)
			if name == "minimal" {
				// The policy ConfigMap is the site's own; give the checks a stand-in.
				objs = append(objs, object{kind: "ConfigMap", name: "site-policy", namespace: "modelpack",
					obj: &corev1.ConfigMap{Data: map[string]string{"policy.yaml": "default: {none: true}\n"}}})
			}
			checkInstall(t, objs)
			if name == "everything" {
				checkMirrors(t, objs)
				ix := index(objs)
				for _, k := range []string{"PodMonitor/modelpack", "ServiceMonitor/modelpack"} {
					if _, ok := ix[k]; !ok {
						t.Errorf("metrics.*Monitor.enabled did not render %s", k)
					}
				}
			}
			if name == "minimal" {
				for _, o := range objs {
					if o.kind == "Deployment" || o.name == "modelpack-prepull" {
						t.Errorf("%s %s rendered though disabled", o.kind, o.name)
					}
				}
			}
		})
	}
}

// TestHelmMatchesKustomize holds the chart to the same objects as the kustomize overlay it mirrors, down to every
// container's image and arguments and the admission policy's whole spec, so the two installs cannot drift apart.
func TestHelmMatchesKustomize(t *testing.T) {
	for overlay, sets := range map[string][]string{
		"default":        nil,
		"native-volumes": {"nativeVolumes.enabled=true", "nativeVolumes.prefixes[0]=registry.example.com/models"},
		"p2p-kraken":     krakenSets,
	} {
		t.Run(overlay, func(t *testing.T) { compareInstalls(t, index(kustomize(t, overlay)), index(helm(t, sets...))) })
	}
}

func compareInstalls(t *testing.T, k, h map[string]object) {
	t.Helper()
	for key := range k {
		if key == "Namespace/modelpack" { // helm installs into a namespace it is given (--create-namespace)
			continue
		}
		if _, ok := h[key]; !ok {
			t.Errorf("the chart does not render %s", key)
		}
	}
	for key := range h {
		if _, ok := k[key]; !ok {
			t.Errorf("the chart renders %s, which the default overlay has not", key)
		}
	}
	for key, ko := range k {
		ho, ok := h[key]
		if !ok {
			continue
		}
		kp, hp := podSpec(ko), podSpec(ho)
		if kp == nil {
			continue
		}
		for _, kc := range kp.Containers {
			hc := container(hp, kc.Name)
			if hc == nil {
				t.Errorf("%s: the chart has no container %s", key, kc.Name)
				continue
			}
			if kc.Image != hc.Image {
				t.Errorf("%s/%s: image %s in kustomize, %s in the chart", key, kc.Name, kc.Image, hc.Image)
			}
			if !slices.Equal(kc.Args, hc.Args) {
				t.Errorf("%s/%s: args differ:\n kustomize %q\n chart     %q", key, kc.Name, kc.Args, hc.Args)
			}
		}
	}
	for _, kind := range []string{"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"} {
		ko, kok := k[kind+"/modelpack-image-volumes"]
		ho, hok := h[kind+"/modelpack-image-volumes"]
		if kok && hok && !equality.Semantic.DeepEqual(specOf(ko.obj), specOf(ho.obj)) {
			t.Errorf("%s differs (-kustomize +chart):\n%s", kind, diff.Diff(specOf(ko.obj), specOf(ho.obj)))
		}
	}
	for _, name := range []string{"modelpack-policy", "modelpack-prepull", "kraken-config", "modelpack-p2p-mirrors"} {
		ko, kok := k["ConfigMap/"+name]
		ho, hok := h["ConfigMap/"+name]
		if !kok || !hok {
			continue // a missing one is reported above
		}
		kc, hc := ko.obj.(*corev1.ConfigMap), ho.obj.(*corev1.ConfigMap)
		for key, v := range kc.Data {
			if strings.TrimSpace(stripComments(v)) != strings.TrimSpace(stripComments(hc.Data[key])) {
				t.Errorf("ConfigMap %s key %s differs:\n kustomize %q\n chart     %q", name, key, v, hc.Data[key])
			}
		}
	}
}

func TestRenderedIsCurrent(t *testing.T) {
	for source, file := range map[string]string{"overlays/default": "modelpack.yaml", "components/native-volumes": "native-volumes.yaml"} {
		want := run(t, testenv.Tool(t, "kustomize"), "build", source)
		got, err := os.ReadFile("rendered/" + file)
		if err != nil {
			t.Fatal(err)
		}
		_, body, _ := bytes.Cut(got, []byte("\n"))
		if !bytes.Equal(body, want) {
			t.Fatalf("deploy/rendered/%s is stale: run `make manifests`", file)
		}
		if file == "modelpack.yaml" {
			checkInstall(t, decode(t, "rendered", got))
		} else {
			checkInstall(t, append(decode(t, "rendered", got), kustomize(t, "default")...))
		}
	}
}

func TestExamples(t *testing.T) {
	driver := only[*storagev1.CSIDriver](t, kustomize(t, "default")).Name
	files, _ := filepath.Glob("examples/*.yaml")
	if len(files) < 3 {
		t.Fatalf("examples: %v", files)
	}
	seen := map[string]bool{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range decode(t, f, data) {
			var drivers []string
			var attrs []map[string]string
			switch v := o.obj.(type) {
			case *storagev1.StorageClass:
				drivers, attrs = append(drivers, v.Provisioner), append(attrs, v.Parameters)
			case *corev1.PersistentVolume:
				if v.Spec.CSI != nil {
					drivers, attrs = append(drivers, v.Spec.CSI.Driver), append(attrs, v.Spec.CSI.VolumeAttributes)
				}
			case *corev1.Pod:
				for _, vol := range v.Spec.Volumes {
					if vol.CSI != nil {
						drivers, attrs = append(drivers, vol.CSI.Driver), append(attrs, vol.CSI.VolumeAttributes)
					}
				}
			}
			for _, d := range drivers {
				if d != driver {
					t.Errorf("%s: %s %s names driver %q, the CSIDriver is %q", f, o.kind, o.name, d, driver)
				}
			}
			for _, a := range attrs {
				if _, err := registry.ParseReference(a["reference"]); err != nil {
					t.Errorf("%s: %s %s: reference %q: %v", f, o.kind, o.name, a["reference"], err)
				}
			}
			if len(drivers) > 0 {
				seen[o.kind] = true
			}
		}
	}
	for _, k := range []string{"Pod", "PersistentVolume", "StorageClass"} {
		if !seen[k] {
			t.Errorf("no example %s uses the driver", k)
		}
	}
}

// checkInstall holds one rendered install to the invariants a working deployment needs.
func checkInstall(t *testing.T, objs []object) {
	t.Helper()
	ix := index(objs)
	for _, o := range objs {
		switch o.kind {
		case "Namespace", "CSIDriver", "ClusterRole", "ClusterRoleBinding", "StorageClass", "PersistentVolume", "PriorityClass",
			"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding":
		default:
			if o.namespace != "modelpack" {
				t.Errorf("%s %s is in namespace %q, want modelpack", o.kind, o.name, o.namespace)
			}
		}
		if ps := podSpec(o); ps != nil {
			checkImages(t, o, ps)
			for _, c := range ps.Containers {
				if strings.Contains(c.Image, "/modelpack/modelpack") { // not the Kraken image beside it
					checkCommandLine(t, o, c)
				}
			}
		}
	}

	drv := only[*storagev1.CSIDriver](t, objs)
	if _, ok := ix["MutatingAdmissionPolicy/modelpack-image-volumes"]; ok {
		checkNativeVolumes(t, objs, drv.Name)
	}
	if drv.Spec.AttachRequired == nil || *drv.Spec.AttachRequired {
		t.Error("CSIDriver: attachRequired must be false")
	}
	if drv.Spec.PodInfoOnMount == nil || !*drv.Spec.PodInfoOnMount {
		t.Error("CSIDriver: podInfoOnMount must be true")
	}
	if !slices.Contains(drv.Spec.VolumeLifecycleModes, storagev1.VolumeLifecycleEphemeral) ||
		!slices.Contains(drv.Spec.VolumeLifecycleModes, storagev1.VolumeLifecyclePersistent) {
		t.Errorf("CSIDriver: volumeLifecycleModes = %v", drv.Spec.VolumeLifecycleModes)
	}
	if drv.Spec.FSGroupPolicy == nil || *drv.Spec.FSGroupPolicy != storagev1.NoneFSGroupPolicy {
		t.Errorf("CSIDriver: fsGroupPolicy must be None for a shared read-only volume")
	}

	node := ix["DaemonSet/modelpack-node"]
	if node.obj == nil {
		t.Fatal("no node DaemonSet")
	}
	ps := podSpec(node)
	plugin := container(ps, "modelpack")
	flags := parseFlags(plugin.Args)
	if flags["driver-name"] != drv.Name {
		t.Errorf("plugin --driver-name %q, CSIDriver %q", flags["driver-name"], drv.Name)
	}
	if ps.PriorityClassName != "system-node-critical" {
		t.Errorf("node priorityClassName = %q", ps.PriorityClassName)
	}
	if plugin.SecurityContext == nil || plugin.SecurityContext.Privileged == nil || !*plugin.SecurityContext.Privileged {
		t.Error("the plugin must be privileged to mount into pods")
	}
	checkSidecars(t, ps)
	checkCacheSize(t, plugin)
	checkVerificationPolicy(t, plugin)
	checkMetricsServices(t, ix, objs)
	// The kubelet directory: mounted Bidirectional at the same path as on the host.
	var kubeletDir string
	for _, m := range plugin.VolumeMounts {
		if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
			kubeletDir = hostPath(t, ps, m.Name)
			if m.MountPath != kubeletDir {
				t.Errorf("kubelet dir mounted at %s, host path %s: target paths would not match", m.MountPath, kubeletDir)
			}
		}
	}
	if kubeletDir == "" {
		t.Fatal("no Bidirectional mount of the kubelet directory")
	}
	pluginDir := kubeletDir + "/plugins/" + drv.Name
	endpoint := strings.TrimPrefix(flags["endpoint"], "unix://")
	if hp := hostPathAt(t, ps, plugin, path.Dir(endpoint)); hp != pluginDir {
		t.Errorf("plugin socket dir %s is host %q, want %s", path.Dir(endpoint), hp, pluginDir)
	}
	if hostPathAt(t, ps, plugin, "/var/lib/modelpack") == "" && flags["root"] == "/var/lib/modelpack" {
		t.Error("the cache root is not a hostPath")
	}
	checkRequests(t, node, ps)

	reg := container(ps, "node-driver-registrar")
	if reg == nil {
		t.Fatal("no node-driver-registrar")
	}
	rf := parseFlags(reg.Args)
	if got := rf["kubelet-registration-path"]; got != pluginDir+"/"+path.Base(endpoint) {
		t.Errorf("registrar --kubelet-registration-path %s, plugin socket on the host is %s/%s", got, pluginDir, path.Base(endpoint))
	}
	if rf["csi-address"] != endpoint || hostPathAt(t, ps, reg, path.Dir(endpoint)) != pluginDir {
		t.Errorf("registrar reaches %s (host %s), plugin listens on %s (host %s)", rf["csi-address"], hostPathAt(t, ps, reg, path.Dir(rf["csi-address"])), endpoint, pluginDir)
	}
	if hostPathAt(t, ps, reg, "/registration") != kubeletDir+"/plugins_registry" {
		t.Errorf("registrar /registration is not %s/plugins_registry", kubeletDir)
	}

	lp := container(ps, "liveness-probe")
	if lp == nil {
		t.Fatal("no liveness-probe sidecar")
	}
	lf := parseFlags(lp.Args)
	if lf["csi-address"] != endpoint || hostPathAt(t, ps, lp, path.Dir(endpoint)) != pluginDir {
		t.Errorf("liveness-probe reaches %s, plugin listens on %s", lf["csi-address"], endpoint)
	}
	_, lport, _ := net.SplitHostPort(lf["http-endpoint"])
	if plugin.LivenessProbe == nil || plugin.LivenessProbe.HTTPGet == nil {
		t.Fatal("the plugin has no HTTP liveness probe")
	}
	if got := portNumber(t, plugin, plugin.LivenessProbe.HTTPGet.Port.String()); got != lport {
		t.Errorf("plugin liveness probe on port %s, liveness-probe sidecar serves %s", got, lport)
	}
	if _, mport, _ := net.SplitHostPort(metricsAddr(t, *plugin)); mport == lport {
		t.Errorf("metrics and liveness share port %s in one pod", mport)
	}

	checkPolicy(t, ix, ps, plugin, flags["policy"])

	if sock := flags["prepull-socket"]; flags["prepull"] != "false" {
		if hostPathAt(t, ps, plugin, path.Dir(sock)) != pluginDir {
			t.Errorf("prepull socket %s is not in the plugin dir", sock)
		}
		if pre, ok := ix["DaemonSet/modelpack-prepull"]; ok {
			checkPrepull(t, ix, pre, pluginDir+"/"+path.Base(sock))
		}
	} else if _, ok := ix["DaemonSet/modelpack-prepull"]; ok {
		t.Error("a prepull DaemonSet without a prepull socket on the plugin")
	}

	if ctl, ok := ix["Deployment/modelpack-controller"]; ok {
		cps := podSpec(ctl)
		cp, prov := container(cps, "modelpack"), container(cps, "csi-provisioner")
		if cp == nil || prov == nil {
			t.Fatal("the controller needs the plugin and csi-provisioner")
		}
		cf, pf := parseFlags(cp.Args), parseFlags(prov.Args)
		if cf["driver-name"] != drv.Name {
			t.Errorf("controller --driver-name %q, CSIDriver %q", cf["driver-name"], drv.Name)
		}
		cend := strings.TrimPrefix(cf["endpoint"], "unix://")
		if pf["csi-address"] != cend || mountOf(cps, cp, path.Dir(cend)) != mountOf(cps, prov, path.Dir(cend)) || mountOf(cps, cp, path.Dir(cend)) == "" {
			t.Errorf("provisioner reaches %s, controller plugin listens on %s", pf["csi-address"], cend)
		}
		if cf["prepull"] != "false" {
			t.Error("the controller serves prepulls")
		}
		if !boundTo(ix, cps.ServiceAccountName, "ClusterRoleBinding", "modelpack-provisioner") {
			t.Error("the provisioner's ServiceAccount is not bound to its ClusterRole")
		}
		checkRequests(t, ctl, cps)
	}
}

// checkSidecars holds every container but the privileged plugin to a restricted securityContext.
func checkSidecars(t *testing.T, ps *corev1.PodSpec) {
	t.Helper()
	for _, c := range ps.Containers {
		if c.Name == "modelpack" {
			continue
		}
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || sc.SeccompProfile == nil {
			t.Errorf("sidecar %s: securityContext %+v, want no privilege escalation, read-only root, all capabilities dropped, a seccomp profile", c.Name, sc)
		}
	}
}

// checkCacheSize: --cache-max-size is given once, from the CACHE_MAX_SIZE env value overlays set.
func checkCacheSize(t *testing.T, plugin *corev1.Container) {
	t.Helper()
	n := 0
	for _, a := range plugin.Args {
		if strings.HasPrefix(a, "--cache-max-size") {
			n++
			if a != "--cache-max-size=$(CACHE_MAX_SIZE)" {
				t.Errorf("plugin %s, want --cache-max-size=$(CACHE_MAX_SIZE)", a)
			}
		}
	}
	if n != 1 {
		t.Errorf("plugin has --cache-max-size %d times", n)
	}
	for _, e := range plugin.Env {
		if e.Name == "CACHE_MAX_SIZE" {
			if _, err := humanize.ParseBytes(e.Value); err != nil {
				t.Errorf("CACHE_MAX_SIZE %q: %v", e.Value, err)
			}
			return
		}
	}
	t.Error("plugin has no CACHE_MAX_SIZE env")
}

// checkVerificationPolicy: the access policy's two flags are given once each, from env values that the driver
// accepts (kubelet's names), so overlays and Helm values set them by name.
func checkVerificationPolicy(t *testing.T, plugin *corev1.Container) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range plugin.Env {
		env[e.Name] = e.Value
	}
	for flag, name := range map[string]string{
		"--image-pull-credentials-verification-policy": "IMAGE_PULL_CREDENTIALS_VERIFICATION_POLICY",
		"--preloaded-images-verification-allowlist":    "PRELOADED_IMAGES_VERIFICATION_ALLOWLIST",
	} {
		n := 0
		for _, a := range plugin.Args {
			if strings.HasPrefix(a, flag+"=") || a == flag {
				n++
				if a != flag+"=$("+name+")" {
					t.Errorf("plugin %s, want %s=$(%s)", a, flag, name)
				}
			}
		}
		if _, ok := env[name]; n != 1 || !ok {
			t.Errorf("plugin has %s %d times and env %s %v", flag, n, name, ok)
		}
	}
	var allow []string
	if v := env["PRELOADED_IMAGES_VERIFICATION_ALLOWLIST"]; v != "" {
		allow = strings.Split(v, ",")
	}
	if _, err := access.NewPolicy(env["IMAGE_PULL_CREDENTIALS_VERIFICATION_POLICY"], allow); err != nil {
		t.Errorf("the driver would refuse the policy: %v", err)
	}
	return env
}

// The default install verifies as kubelet 1.36 does by default; the production overlay verifies every pod,
// prepulled models included; Helm values reach the flags.
func TestVerificationPolicy(t *testing.T) {
	plugin := func(objs []object) *corev1.Container {
		return container(podSpec(index(objs)["DaemonSet/modelpack-node"]), "modelpack")
	}
	for name, tc := range map[string]struct {
		objs        func(t *testing.T) []object
		mode, allow string
	}{
		"kustomize default":    {func(t *testing.T) []object { return kustomize(t, "default") }, "NeverVerifyPreloadedImages", ""},
		"kustomize production": {func(t *testing.T) []object { return kustomize(t, "production") }, "AlwaysVerify", ""},
		"helm default":         {func(t *testing.T) []object { return helm(t) }, "NeverVerifyPreloadedImages", ""},
		"helm allowlist": {func(t *testing.T) []object {
			return helm(t, "node.imagePullCredentialsVerificationPolicy=NeverVerifyAllowlistedImages",
				"node.preloadedImagesVerificationAllowlist[0]=registry.example.com/public/*",
				"node.preloadedImagesVerificationAllowlist[1]=ghcr.io/acme/base")
		}, "NeverVerifyAllowlistedImages", "registry.example.com/public/*,ghcr.io/acme/base"},
	} {
		t.Run(name, func(t *testing.T) {
			env := checkVerificationPolicy(t, plugin(tc.objs(t)))
			if env["IMAGE_PULL_CREDENTIALS_VERIFICATION_POLICY"] != tc.mode || env["PRELOADED_IMAGES_VERIFICATION_ALLOWLIST"] != tc.allow {
				t.Errorf("policy %q, allowlist %q; want %q, %q", env["IMAGE_PULL_CREDENTIALS_VERIFICATION_POLICY"],
					env["PRELOADED_IMAGES_VERIFICATION_ALLOWLIST"], tc.mode, tc.allow)
			}
		})
	}
}

// checkMetricsServices: each metrics Service selects pods that expose its port as "metrics".
func checkMetricsServices(t *testing.T, ix map[string]object, objs []object) {
	t.Helper()
	for name, port := range map[string]int32{"modelpack-node-metrics": 9808, "modelpack-prepull-metrics": 9809} {
		o, ok := ix["Service/"+name]
		if !ok {
			if name == "modelpack-prepull-metrics" && ix["DaemonSet/modelpack-prepull"].obj == nil {
				continue
			}
			t.Errorf("no Service %s", name)
			continue
		}
		svc := o.obj.(*corev1.Service)
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != port || svc.Spec.Ports[0].TargetPort.StrVal != "metrics" {
			t.Errorf("Service %s ports %+v, want %d → metrics", name, svc.Spec.Ports, port)
		}
		matched := false
		for _, w := range objs {
			ps := podSpec(w)
			if ps == nil || w.kind != "DaemonSet" {
				continue
			}
			labels := w.obj.(*appsv1.DaemonSet).Spec.Template.Labels
			sel := true
			for k, v := range svc.Spec.Selector {
				sel = sel && labels[k] == v
			}
			if !sel {
				continue
			}
			matched = true
			// The Service targets the port by name, so an overlay may move it (the local cluster's host network
			// does); what must hold is that the named port is the one the process listens on.
			found := false
			for _, c := range ps.Containers {
				for _, p := range c.Ports {
					if p.Name != "metrics" {
						continue
					}
					found = true
					if addr := metricsAddr(t, c); !strings.HasSuffix(addr, fmt.Sprintf(":%d", p.ContainerPort)) {
						t.Errorf("%s container %s: metrics port %d, but --metrics-addr=%q", w.name, c.Name, p.ContainerPort, addr)
					}
				}
			}
			if !found {
				t.Errorf("Service %s selects %s, which has no port named metrics", name, w.name)
			}
		}
		if !matched {
			t.Errorf("Service %s selects no pods", name)
		}
	}
}

func checkPrepull(t *testing.T, ix map[string]object, pre object, hostSocket string) {
	t.Helper()
	ps := podSpec(pre)
	c := container(ps, "prepull")
	if c == nil {
		t.Fatal("prepull DaemonSet has no prepull container")
	}
	// A priority that schedules it ahead of a backlog without preempting, and no control-plane nodes.
	if pc, ok := ix["PriorityClass/"+ps.PriorityClassName].obj.(*schedulingv1.PriorityClass); !ok || pc.PreemptionPolicy == nil || *pc.PreemptionPolicy != corev1.PreemptNever || pc.Value <= 0 {
		t.Errorf("prepull priorityClassName %q: no PriorityClass above 0 that never preempts", ps.PriorityClassName)
	}
	excluded := false
	if a := ps.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, e := range term.MatchExpressions {
				excluded = excluded || (e.Key == "node-role.kubernetes.io/control-plane" && e.Operator == corev1.NodeSelectorOpDoesNotExist)
			}
		}
	}
	if !excluded {
		t.Error("the prepull DaemonSet may run on control-plane nodes")
	}
	// Ready only when the node holds every listed model: the probe reads the watcher's /readyz on the metrics port.
	if rp := c.ReadinessProbe; rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/readyz" || rp.HTTPGet.Port.String() != "metrics" {
		t.Errorf("prepull readinessProbe %+v: want httpGet /readyz on the metrics port", rp)
	}
	f := parseFlags(c.Args)
	if got := hostPathAt(t, ps, c, path.Dir(f["socket"])) + "/" + path.Base(f["socket"]); got != hostSocket {
		t.Errorf("prepull reaches %s on the host, the plugin serves %s", got, hostSocket)
	}
	watch := f["watch"]
	var cm string
	for _, m := range c.VolumeMounts {
		if m.MountPath == path.Dir(watch) {
			if m.SubPath != "" {
				t.Error("the list is mounted with subPath: ConfigMap updates would never arrive")
			}
			for _, v := range ps.Volumes {
				if v.Name == m.Name && v.ConfigMap != nil {
					cm = v.ConfigMap.Name
				}
			}
		}
	}
	cmo, ok := ix["ConfigMap/"+cm]
	if !ok {
		t.Fatalf("--watch %s is not a mounted ConfigMap of the install", watch)
	}
	list, ok := cmo.obj.(*corev1.ConfigMap).Data[path.Base(watch)]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", cm, path.Base(watch))
	}
	if _, err := prepull.ParseList([]byte(list)); err != nil {
		t.Errorf("ConfigMap %s: %v", cm, err)
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Error("the prepull DaemonSet mounts an API token it has no use for")
	}
	for _, kind := range []string{"RoleBinding", "ClusterRoleBinding"} {
		if boundTo(ix, ps.ServiceAccountName, kind, "") {
			t.Errorf("the prepull ServiceAccount has a %s: it needs no API permissions", kind)
		}
	}
	if addr := metricsAddr(t, *c); portNumber(t, c, "metrics") != portOf(addr) {
		t.Errorf("prepull metrics on %s, port named metrics differs", addr)
	}
	checkRequests(t, pre, ps)
}

// checkPolicy loads the policy the plugin is given with the real policy loader, key files included.
func checkPolicy(t *testing.T, ix map[string]object, ps *corev1.PodSpec, plugin *corev1.Container, policyPath string) {
	t.Helper()
	if policyPath == "" {
		t.Fatal("the plugin has no --policy")
	}
	var cm string
	for _, m := range plugin.VolumeMounts {
		if m.MountPath == path.Dir(policyPath) {
			for _, v := range ps.Volumes {
				if v.Name == m.Name && v.ConfigMap != nil {
					cm = v.ConfigMap.Name
				}
			}
		}
	}
	cmo, ok := ix["ConfigMap/"+cm]
	if !ok {
		t.Fatalf("--policy %s is not a mounted ConfigMap of the install", policyPath)
	}
	content, ok := cmo.obj.(*corev1.ConfigMap).Data[path.Base(policyPath)]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", cm, path.Base(policyPath))
	}
	// Key files the policy names must be mounted; stand-ins take their place so the loader can read them.
	dir := t.TempDir()
	content = regexp.MustCompile(`(?m)#.*$`).ReplaceAllString(content, "")
	content = regexp.MustCompile(`/etc/modelpack/[^\s,\]"']+`).ReplaceAllStringFunc(content, func(m string) string {
		if mountOf(ps, plugin, path.Dir(m)) == "" {
			t.Errorf("the policy reads %s, which is not mounted", m)
		}
		local := filepath.Join(dir, filepath.FromSlash(m))
		if _, err := os.Stat(local); err != nil {
			if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
				t.Fatal(err)
			}
			writePublicKey(t, local)
		}
		return local
	})
	p := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := signing.LoadPolicy(p); err != nil {
		t.Errorf("ConfigMap %s: %v", cm, err)
	}
}

func writePublicKey(t *testing.T, p string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
}

func checkMirrors(t *testing.T, objs []object) {
	t.Helper()
	ix := index(objs)
	ps := podSpec(ix["DaemonSet/modelpack-node"])
	plugin := container(ps, "modelpack")
	dir := parseFlags(plugin.Args)["hosts-dir"]
	var vol *corev1.Volume
	for _, m := range plugin.VolumeMounts {
		if m.MountPath == dir {
			for i := range ps.Volumes {
				if ps.Volumes[i].Name == m.Name {
					vol = &ps.Volumes[i]
				}
			}
		}
	}
	if dir == "" || vol == nil || vol.ConfigMap == nil {
		t.Fatalf("--hosts-dir %q is not a mounted ConfigMap", dir)
	}
	cm := ix["ConfigMap/"+vol.ConfigMap.Name].obj.(*corev1.ConfigMap)
	var paths []string
	for _, it := range vol.ConfigMap.Items {
		if _, ok := cm.Data[it.Key]; !ok {
			t.Errorf("mirrors item %s names a missing key", it.Key)
		}
		paths = append(paths, it.Path)
	}
	slices.Sort(paths)
	if want := []string{"_default/hosts.toml", "docker.io/hosts.toml"}; !slices.Equal(paths, want) {
		t.Errorf("hosts.toml files %v, want %v", paths, want)
	}
}

// checkCommandLine holds the arguments given to our image to the flags the modelpack command really has, so a
// renamed or missing flag fails here instead of in a crash-looping pod.
func checkCommandLine(t *testing.T, o object, c corev1.Container) {
	t.Helper()
	if len(c.Args) == 0 {
		t.Errorf("%s %s container %s: no command", o.kind, o.name, c.Name)
		return
	}
	cmd, rest, err := cli.NewRoot().Find(c.Args)
	if err != nil || cmd.Name() != c.Args[0] {
		t.Errorf("%s %s container %s: no command %q: %v", o.kind, o.name, c.Name, c.Args[0], err)
		return
	}
	seen := map[string]bool{}
	for _, a := range rest {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if f := cmd.Flags().Lookup(name); seen[name] && f != nil && !strings.HasSuffix(f.Value.Type(), "Array") && !strings.HasSuffix(f.Value.Type(), "Slice") {
			t.Errorf("%s %s container %s: --%s is given more than once; an SRE reading it cannot tell which wins", o.kind, o.name, c.Name, name)
		}
		seen[name] = true
		if !strings.HasPrefix(a, "--") || (cmd.Flags().Lookup(name) == nil && cmd.InheritedFlags().Lookup(name) == nil) {
			t.Errorf("%s %s container %s: `modelpack %s` has no flag %s", o.kind, o.name, c.Name, c.Args[0], a)
		}
	}
}

var pinned = regexp.MustCompile(`^[^@]+(@sha256:[0-9a-f]{64}|:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})$`)

func checkImages(t *testing.T, o object, ps *corev1.PodSpec) {
	t.Helper()
	for _, c := range append(slices.Clone(ps.InitContainers), ps.Containers...) {
		name := c.Image
		if i := strings.LastIndex(name, "/"); i >= 0 {
			name = name[i+1:]
		}
		if !pinned.MatchString(name) || strings.HasSuffix(c.Image, ":latest") {
			t.Errorf("%s %s container %s: image %q is not pinned to a tag or digest", o.kind, o.name, c.Name, c.Image)
		}
	}
}

func checkRequests(t *testing.T, o object, ps *corev1.PodSpec) {
	t.Helper()
	for _, c := range ps.Containers {
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
			t.Errorf("%s %s container %s has no CPU and memory requests", o.kind, o.name, c.Name)
		}
	}
}

func index(objs []object) map[string]object {
	m := map[string]object{}
	for _, o := range objs {
		m[o.kind+"/"+o.name] = o
	}
	return m
}

func only[T any](t *testing.T, objs []object) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if v, ok := o.obj.(T); ok {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want exactly one %T, have %d", zero, len(found))
	}
	return found[0]
}

func podSpec(o object) *corev1.PodSpec {
	switch v := o.obj.(type) {
	case *appsv1.DaemonSet:
		return &v.Spec.Template.Spec
	case *appsv1.Deployment:
		return &v.Spec.Template.Spec
	case *appsv1.StatefulSet:
		return &v.Spec.Template.Spec
	case *corev1.Pod:
		return &v.Spec
	}
	return nil
}

func container(ps *corev1.PodSpec, name string) *corev1.Container {
	for i := range ps.Containers {
		if ps.Containers[i].Name == name {
			return &ps.Containers[i]
		}
	}
	return nil
}

// parseFlags reads --name=value arguments; a flag given twice takes its last value, as pflag does.
// metricsAddr is the address a modelpack container's metrics listen on: its --metrics-addr, or the binary's
// default, POD_IP's address (the container must then take POD_IP from the downward API's status.podIP) on the
// command's port. A container that would listen on every interface fails the test.
func metricsAddr(t *testing.T, c corev1.Container) string {
	t.Helper()
	addr, ok := parseFlags(c.Args)["metrics-addr"]
	if !ok {
		podIP := false
		for _, e := range c.Env {
			if e.Name == "POD_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP" {
				podIP = true
			}
		}
		if !podIP {
			t.Errorf("container %s: no --metrics-addr and no POD_IP from status.podIP: metrics would listen on loopback only", c.Name)
		}
		port := "9808"
		if len(c.Args) > 0 && c.Args[0] == "prepull" {
			port = "9809"
		}
		addr = "$(POD_IP):" + port
	}
	if host, _, err := net.SplitHostPort(addr); err != nil || host == "" || host == "0.0.0.0" || host == "::" {
		t.Errorf("container %s: metrics on %q listen on every interface", c.Name, addr)
	}
	return addr
}

func parseFlags(args []string) map[string]string {
	m := map[string]string{}
	for _, a := range args {
		if k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok && strings.HasPrefix(a, "--") {
			m[k] = v
		} else if strings.HasPrefix(a, "--") {
			m[k] = "true"
		}
	}
	return m
}

func portOf(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

// mountOf returns the volume mounted at dir in c, or "".
func mountOf(ps *corev1.PodSpec, c *corev1.Container, dir string) string {
	for _, m := range c.VolumeMounts {
		if m.MountPath == dir {
			return m.Name
		}
	}
	return ""
}

// hostPathAt returns the host path of the hostPath volume mounted at dir in c, or "".
func hostPathAt(t *testing.T, ps *corev1.PodSpec, c *corev1.Container, dir string) string {
	t.Helper()
	name := mountOf(ps, c, dir)
	if name == "" {
		return ""
	}
	return hostPath(t, ps, name)
}

func hostPath(t *testing.T, ps *corev1.PodSpec, volume string) string {
	t.Helper()
	for _, v := range ps.Volumes {
		if v.Name == volume && v.HostPath != nil {
			return v.HostPath.Path
		}
	}
	return ""
}

func portNumber(t *testing.T, c *corev1.Container, port string) string {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == port {
			return fmt.Sprint(p.ContainerPort)
		}
	}
	return port
}

func boundTo(ix map[string]object, sa, kind, role string) bool {
	for _, o := range ix {
		var subjects []rbacv1.Subject
		var ref rbacv1.RoleRef
		switch v := o.obj.(type) {
		case *rbacv1.ClusterRoleBinding:
			subjects, ref = v.Subjects, v.RoleRef
		case *rbacv1.RoleBinding:
			subjects, ref = v.Subjects, v.RoleRef
		default:
			continue
		}
		if o.kind != kind || (role != "" && ref.Name != role) {
			continue
		}
		for _, s := range subjects {
			if s.Kind == "ServiceAccount" && s.Name == sa {
				return true
			}
		}
	}
	return false
}

func TestHelmLint(t *testing.T) {
	out := run(t, testenv.Tool(t, "helm"), "lint", "--strict", "helm/modelpack")
	if !bytes.Contains(out, []byte("0 chart(s) failed")) {
		t.Fatalf("helm lint:\n%s", out)
	}
}

// TestDockerfile keeps the image build in step with the module, since no Docker engine here can build it: the
// builder's Go is the module's, the package it builds is the CLI, and the version it stamps is a real variable.
func TestDockerfile(t *testing.T) {
	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVer := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
	argVer := regexp.MustCompile(`(?m)^ARG GO_VERSION=(\S+)$`).FindSubmatch(df)
	if goVer == nil || argVer == nil || string(goVer[1]) != string(argVer[1]) {
		t.Errorf("Dockerfile GO_VERSION %q, go.mod says %q", argVer, goVer)
	}
	if !bytes.Contains(df, []byte("./cli/modelpack")) {
		t.Error("the Dockerfile does not build ./cli/modelpack")
	}
	if _, err := os.Stat("../cli/modelpack/main.go"); err != nil {
		t.Error(err)
	}
	if !bytes.Contains(df, []byte("-X github.com/modelpack/modelpack/cli.Version=")) || cli.Version == "" {
		t.Error("the Dockerfile does not stamp cli.Version")
	}
	for _, from := range regexp.MustCompile(`(?m)^FROM (?:--platform=\S+ )?(\S+)`).FindAllSubmatch(df, -1) {
		img := strings.ReplaceAll(string(from[1]), "${GO_VERSION}", string(argVer[1]))
		if img == "scratch" {
			continue // the empty base: nothing to pin
		}
		if !pinned.MatchString(img[strings.LastIndex(img, "/")+1:]) || strings.HasSuffix(img, ":latest") {
			t.Errorf("base image %s is not pinned to a tag or digest", img)
		}
	}
	// The Dockerfile's image is the one internal/cmd/image (make image) builds: the binary and the CA bundle at
	// the same paths, on an empty base.
	builder, err := os.ReadFile("../internal/cmd/image/main.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/usr/local/bin/modelpack", "/etc/ssl/certs/ca-certificates.crt"} {
		if !bytes.Contains(df, []byte(" "+path+"\n")) || !bytes.Contains(builder, []byte("="+path)) {
			t.Errorf("%s: the Dockerfile and internal/cmd/image do not both put it in the image", path)
		}
	}
	if !regexp.MustCompile(`(?m)^FROM scratch$`).Match(df) {
		t.Error("the Dockerfile's image is not FROM scratch, as internal/cmd/image's is")
	}
}

// TestHelmValuesSchema: a mistyped or unpinned value fails at install time, not as a broken pod.
func TestHelmValuesSchema(t *testing.T) {
	helmBin := testenv.Tool(t, "helm")
	for set, want := range map[string]string{
		"cache.maxSiz=1TiB": "additional properties 'maxSiz'",
		"sidecars.registrar.image=registry.k8s.io/sig-storage/csi-node-driver-registrar:latest": "/sidecars/registrar/image",
		"prepull.concurrency=0":  "/prepull/concurrency",
		"cache.maxSize=lots":     "/cache/maxSize",
		"node.logFormat=xml":     "/node/logFormat",
		"mirrors._default[0]=m1": "/mirrors/_default/0",
		"nativeVolumes.prefixes[0]=registry.example.com/models:v1": "/nativeVolumes/prefixes/0",
		"node.updateStrategy.type=Recreate":                        "/node/updateStrategy/type",
		"prepull.updateStrategy.rollingUpdate.maxUnavailable=half": "/prepull/updateStrategy/rollingUpdate/maxUnavailable",
		"node.updateStrategy.rollingUpdate.maxUnavalable=1":        "additional properties 'maxUnavalable'",
		"node.registryCredentials.secretName=Registry_Creds":       "/node/registryCredentials/secretName",
		"node.registryCredentials.name=registry-creds":             "additional properties 'name'",
		"node.podLabels.tier=1":                                    "/node/podLabels/tier",
		"prepull.podAnnotations.team=7":                            "/prepull/podAnnotations/team",
		"controller.podLabels.tier=1":                              "/controller/podLabels/tier",
		"node.tolerations=all":                                     "/node/tolerations",
		"prepull.tolerations[0]=all":                               "/prepull/tolerations/0",
		"controller.tolerations=all":                               "/controller/tolerations",
		"node.affinity=anywhere":                                   "/node/affinity",
		"controller.affinity=anywhere":                             "/controller/affinity",
		"node.nodeSelector.gpu=true":                               "/node/nodeSelector/gpu",
		"controller.priorityClassName[0]=high":                     "/controller/priorityClassName",
		"node.resources=small":                                     "/node/resources",
	} {
		cmd := exec.Command(helmBin, "template", "modelpack", "helm/modelpack", "--set", set)
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("--set %s: %v, want a schema error naming %s:\n%s", set, err, want, out)
		}
	}
}

// The chart works as a subchart (a parent sets global values), gives the node plugin a private registry CA and
// any extra volume (a docker config Secret), and narrows the native-volumes binding to some namespaces; each
// rendered by the real helm and decoded strictly.
func TestHelmSubchartCAAndNamespaceSelector(t *testing.T) {
	parent := t.TempDir()
	os.MkdirAll(filepath.Join(parent, "charts"), 0o755)
	if out, err := exec.Command("cp", "-r", "helm/modelpack", filepath.Join(parent, "charts", "modelpack")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	os.WriteFile(filepath.Join(parent, "Chart.yaml"), []byte("apiVersion: v2\nname: platform\nversion: 1.0.0\ndependencies:\n- name: modelpack\n  version: \">=0.0.0\"\n"), 0o644)
	os.WriteFile(filepath.Join(parent, "values.yaml"), []byte("global:\n  imageRegistry: registry.example.com\nmodelpack:\n  prepull:\n    enabled: false\n"), 0o644)
	objs := decode(t, "parent chart", run(t, testenv.Tool(t, "helm"), "template", "platform", parent, "--namespace", "modelpack"))
	if _, ok := index(objs)["DaemonSet/modelpack-node"]; !ok {
		t.Fatalf("the parent chart did not render the node DaemonSet: %v", objs)
	}

	objs = helm(t, "global.imageRegistry=registry.example.com",
		"registryCA.secretName=registry-ca", "registryCA.key=ca.pem",
		"node.extraVolumes[0].name=docker-config", "node.extraVolumes[0].secret.secretName=registry-creds",
		"node.extraVolumeMounts[0].name=docker-config", "node.extraVolumeMounts[0].mountPath=/etc/modelpack/docker",
		"node.extraArgs[0]=--registry-config=/etc/modelpack/docker/config.json",
		"nativeVolumes.enabled=true", "nativeVolumes.prefixes[0]=registry.example.com/models")
	checkInstall(t, objs)
	ix := index(objs)
	ps := podSpec(ix["DaemonSet/modelpack-node"])
	plugin := container(ps, "modelpack")
	flags := parseFlags(plugin.Args)
	if flags["ca-file"] != "/etc/modelpack/registry-ca/ca.pem" || mountOf(ps, plugin, "/etc/modelpack/registry-ca") != "registry-ca" {
		t.Errorf("registryCA: args %v", plugin.Args)
	}
	if mountOf(ps, plugin, "/etc/modelpack/docker") != "docker-config" || flags["registry-config"] != "/etc/modelpack/docker/config.json" {
		t.Errorf("extraVolumes/extraVolumeMounts: %v", plugin.VolumeMounts)
	}
	for _, v := range ps.Volumes {
		if v.Name == "registry-ca" && (v.Secret == nil || v.Secret.SecretName != "registry-ca") {
			t.Errorf("registry-ca volume: %+v", v)
		}
		if v.Name == "docker-config" && (v.Secret == nil || v.Secret.SecretName != "registry-creds") {
			t.Errorf("docker-config volume: %+v", v)
		}
	}
	// checkInstall's admission run creates its pod in an unlabelled namespace, which this selector leaves alone.
	objs = helm(t, "nativeVolumes.enabled=true", "nativeVolumes.prefixes[0]=registry.example.com/models",
		`nativeVolumes.namespaceSelector.matchLabels.modelpack\.csi\.dev/native-volumes=enabled`)
	b := only[*admissionregistrationv1.MutatingAdmissionPolicyBinding](t, objs)
	if b.Spec.MatchResources == nil || b.Spec.MatchResources.NamespaceSelector == nil ||
		b.Spec.MatchResources.NamespaceSelector.MatchLabels["modelpack.csi.dev/native-volumes"] != "enabled" {
		t.Errorf("binding matchResources: %+v", b.Spec.MatchResources)
	}
}
