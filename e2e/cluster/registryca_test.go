//go:build cluster

package cluster

import (
	"crypto/tls"
	"encoding/json"
	"maps"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
	"github.com/modelpack/modelpack/internal/testenv"
)

// TestRegistryCA: a model on a TLS registry whose certificate a private CA signed. Without the CA the node
// plugin refuses it (FailedMount: UNAVAILABLE, certificate signed by unknown authority) and the pod stays Pending;
// given the CA the way deploy/README.md tells users (Helm's registryCA.secretName: a Secret with ca.crt, mounted
// into the node DaemonSet and passed as --ca-file; volume, mount and flag are taken from the chart as rendered),
// a pod reads the model's exact bytes. The DaemonSet is restored afterwards.
func TestRegistryCA(t *testing.T) {
	c := harness.Connect(t)
	caFile, certFile, keyFile := testenv.WriteCA(t)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{CertFile: certFile, KeyFile: keyFile})
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: testenv.CertPool(t, caFile)}}}
	src := genModel(t, 1101, 2)
	ref := pushTo(t, c, src, "https://"+reg.Host, client, "e2e/private-ca:v1", "", "", "--ca-file", caFile)

	const mnt = "/models/m"
	pod := func(name string) {
		t.Helper()
		c.Apply(t, c.PodManifest(harness.PodSpec{Name: name, Script: harness.SumScript(mnt),
			Volumes: []harness.Volume{{Name: "model", MountPath: mnt, CSI: map[string]string{"reference": ref}}}}))
	}

	pod("ca-untrusted")
	event := waitEvent(t, c, "default", "ca-untrusted", "FailedMount",
		regexp.MustCompile(`code = Unavailable desc = .*certificate signed by unknown authority`))
	t.Logf("without the CA, refused as expected: %s", event)
	if p := c.Pod(t, "default", "ca-untrusted"); p.Status.Phase != corev1.PodPending {
		t.Errorf("pod without the CA: %s, want Pending", p.Status.Phase)
	}
	c.Delete(t, "default", "pod/ca-untrusted")

	c.Kubectl(t, "-n", harness.Namespace, "create", "secret", "generic", "registry-ca", "--from-file=ca.crt="+caFile)
	t.Cleanup(func() { c.Run("-n", harness.Namespace, "delete", "secret", "registry-ca", "--ignore-not-found") })
	trustRegistryCA(t, c, "registry-ca")

	pod("ca-trusted")
	c.WaitPhase(t, "default", "ca-trusted", corev1.PodSucceeded, podTimeout)
	if got, want := harness.ParseSums(t, c.Logs(t, "default", "ca-trusted", ""), mnt), harness.TreeSums(t, src); !maps.Equal(got, want) {
		t.Errorf("the pod read other bytes than the source:\ngot  %v\nwant %v", got, want)
	}
}

// trustRegistryCA gives the running node plugin the CA in Secret secret, as the chart's registryCA.secretName
// does: the chart's registry-ca volume, its mount in the plugin's container and its --ca-file flag, rendered by
// `helm template` and added to the DaemonSet, which then rolls out. Test end puts the volumes, mounts and args
// back as they were and waits for that rollout.
func trustRegistryCA(t *testing.T, c *harness.Cluster, secret string) {
	t.Helper()
	out, err := exec.Command(testenv.Tool(t, "helm"), "template", "modelpack", filepath.Join(testenv.RepoRoot(), "deploy", "helm", "modelpack"),
		"--namespace", harness.Namespace, "--set", "registryCA.secretName="+secret, "--show-only", "templates/node.yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	var chart appsv1.DaemonSet
	if err := yaml.Unmarshal(out, &chart); err != nil {
		t.Fatalf("helm template's node DaemonSet: %v", err)
	}
	vol, mount, arg := chartCA(t, chart.Spec.Template.Spec)

	var live appsv1.DaemonSet
	if err := json.Unmarshal([]byte(c.Kubectl(t, "-n", harness.Namespace, "get", "daemonset", "modelpack-node", "-o", "json")), &live); err != nil {
		t.Fatal(err)
	}
	ps := live.Spec.Template.Spec
	i := containerIndex(t, ps, "modelpack")
	ctr := "/spec/template/spec/containers/" + strconv.Itoa(i)
	patch := func(ops []map[string]any) {
		t.Helper()
		b, _ := json.Marshal(ops)
		old := c.DriverPod(t)
		c.Kubectl(t, "-n", harness.Namespace, "patch", "daemonset", "modelpack-node", "--type=json", "-p", string(b))
		awaitDriver(t, c, old)
	}
	t.Cleanup(func() {
		patch([]map[string]any{
			{"op": "replace", "path": "/spec/template/spec/volumes", "value": ps.Volumes},
			{"op": "replace", "path": ctr + "/volumeMounts", "value": ps.Containers[i].VolumeMounts},
			{"op": "replace", "path": ctr + "/args", "value": ps.Containers[i].Args},
		})
	})
	patch([]map[string]any{
		{"op": "add", "path": "/spec/template/spec/volumes/-", "value": vol},
		{"op": "add", "path": ctr + "/volumeMounts/-", "value": mount},
		{"op": "add", "path": ctr + "/args/-", "value": arg},
	})
}

// chartCA picks the chart's registry-ca volume, the plugin container's mount of it and its --ca-file flag.
func chartCA(t *testing.T, ps corev1.PodSpec) (corev1.Volume, corev1.VolumeMount, string) {
	t.Helper()
	var vol *corev1.Volume
	for i := range ps.Volumes {
		if ps.Volumes[i].Secret != nil && ps.Volumes[i].Name == "registry-ca" {
			vol = &ps.Volumes[i]
		}
	}
	plugin := ps.Containers[containerIndex(t, ps, "modelpack")]
	var mount *corev1.VolumeMount
	for i := range plugin.VolumeMounts {
		if vol != nil && plugin.VolumeMounts[i].Name == vol.Name {
			mount = &plugin.VolumeMounts[i]
		}
	}
	var arg string
	for _, a := range plugin.Args {
		if strings.HasPrefix(a, "--ca-file=") {
			arg = a
		}
	}
	if vol == nil || mount == nil || arg == "" {
		t.Fatalf("the chart's registryCA renders no Secret volume registry-ca, mount of it or --ca-file: volumes %v, mounts %v, args %v",
			ps.Volumes, plugin.VolumeMounts, plugin.Args)
	}
	return *vol, *mount, arg
}

func containerIndex(t *testing.T, ps corev1.PodSpec, name string) int {
	t.Helper()
	for i, ctr := range ps.Containers {
		if ctr.Name == name {
			return i
		}
	}
	t.Fatalf("no container %q", name)
	return -1
}
