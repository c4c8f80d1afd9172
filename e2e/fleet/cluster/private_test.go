//go:build fleet

package cluster

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
	"github.com/modelpack/modelpack/internal/testenv"
)

// privateRegistry is where TestKrakenPrivateModel starts a registry with htpasswd and TLS (env.sh
// AUTH_REGISTRY_PORT), on the bridge so every node and Kraken's origin reach it. TLS because Kraken v0.1.27 sends
// a backend's credentials only over TLS (registrybackend/security: "If TLS is disabled, no authentication is
// attempted"), which is right: basic credentials in the clear are not a private registry.
const privateRegistry = "10.218.0.1:25101"

// alice's bcrypt (cost 4) htpasswd line; her password is alice-pw.
const privateHtpasswd = "alice:$2a$04$P09zfd9asiwL8MD/kWd2IO1G4iks7bnazfTKEiuYHe8cEiFnIrf8u\n"

// TestKrakenPrivateModel: a model in a registry that wants credentials, read through Kraken. Kraken's origin holds
// its own credential for that registry (a backend with security.basic, from a Secret through --secrets, as
// deploy/README.md says); the driver sends the agent none. A pod with a nodePublishSecretRef mounts the model on
// two nodes, the blobs coming from the origin's fetch (the registry served them once, to the origin's address);
// a pod without a secret is refused (FailedMount, the registry's "unauthorized") and the agent is not used to
// read its model: the registry served none of its blobs, to the origin or anyone.
func TestKrakenPrivateModel(t *testing.T) {
	c := harness.Connect(t)
	host, _, _ := strings.Cut(privateRegistry, ":")
	caFile, certFile, keyFile := testenv.WriteCAFor(t, host)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: privateHtpasswd, Addr: privateRegistry, AccessLog: true,
		CertFile: certFile, KeyFile: keyFile})
	src := model(t, 7, 2, 2<<20)
	ref, digests, total := pushPrivate(t, c, caFile, src, "private/fleet:v1")
	refused, refusedDigests, _ := pushPrivate(t, c, caFile, model(t, 8, 1, 1<<20), "private/fleet-refused:v1")
	ca, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	c.Apply(t, fmt.Sprintf("apiVersion: v1\nkind: Secret\nmetadata: {name: fleet-private-ca, namespace: %s}\nstringData:\n  ca.pem: %q\n", harness.Namespace, ca))
	trustCA(t, c)
	originCredential(t, c)

	const ns = "fleet-private"
	c.Kubectl(t, "create", "namespace", ns)
	t.Cleanup(func() { c.Run("delete", "namespace", ns, "--wait=true", "--timeout=120s") })
	c.Kubectl(t, "-n", ns, "create", "secret", "docker-registry", "pull", "--docker-server="+privateRegistry,
		"--docker-username=alice", "--docker-password=alice-pw")

	// Pods on the nodes other than the origin's (Kraken's origin runs on the first node's host network), so the
	// registry's client address tells the origin's fetch from a driver's own.
	originIP, readers := c.NodeIPs[c.Nodes[0]], c.Nodes[1:]
	const mnt = "/models/m"
	mark := harness.MarkLog(t, reg.LogPath)
	var pods []string
	for _, n := range readers {
		pods = append(pods, c.PodManifest(harness.PodSpec{Name: "private-" + n, Namespace: ns, Node: n, Script: harness.SumScript(mnt),
			Volumes: []harness.Volume{{Name: "model", MountPath: mnt, SecretRef: "pull", CSI: map[string]string{"reference": ref}}}}))
	}
	c.Apply(t, strings.Join(pods, "---\n"))
	want := harness.TreeSums(t, src)
	for _, n := range readers {
		c.WaitPhase(t, ns, "private-"+n, corev1.PodSucceeded, podTimeout)
		if got := harness.ParseSums(t, c.Logs(t, ns, "private-"+n, ""), mnt); !maps.Equal(got, want) {
			t.Errorf("node %s read other bytes than the source:\ngot  %v\nwant %v", n, got, want)
		}
	}
	served := harness.BlobsServedIn(t, reg.LogPath, mark)
	var sent int64
	for _, d := range digests {
		b := served[d]
		if b == nil {
			continue
		}
		sent += b.Bytes
		for client := range b.ByClient {
			if client != originIP {
				t.Errorf("blob %s was served to %s, not through Kraken's origin (%s): %v", d, client, originIP, b.ByClient)
			}
		}
	}
	t.Logf("%d nodes read a %d-byte private model; the registry served %.2f copies, all to the origin", len(readers), total, float64(sent)/float64(total))
	if n := float64(sent) / float64(total); n < 0.99 || n > 1.1 {
		t.Errorf("the private registry served %.2f copies to Kraken's origin, want 1 (the blobs through Kraken): %s", n, describe(served, digests))
	}

	// Each driver asked the registry itself, with the pod's credentials, whether it serves the model: HEADs the
	// registry answered 200 (it answers 401 to anyone without alice's credentials), no bytes.
	log, err := os.ReadFile(reg.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range readers {
		head := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(c.NodeIPs[n]) + ` \S+ \S+ \[[^\]]*\] "HEAD /v2/private/fleet/(manifests|blobs)/sha256:[0-9a-f]+ HTTP/[0-9.]+" 200 `)
		if !head.Match(log[mark:]) {
			t.Errorf("node %s's driver never asked the registry with the pod's credentials about the model (a HEAD answered 200):\n%s", n, log[mark:])
		}
	}

	mark = harness.MarkLog(t, reg.LogPath)
	c.Apply(t, c.PodManifest(harness.PodSpec{Name: "private-nosecret", Namespace: ns, Node: readers[0], Script: harness.SumScript(mnt),
		Volumes: []harness.Volume{{Name: "model", MountPath: mnt, CSI: map[string]string{"reference": refused}}}}))
	ev := waitFailedMount(t, c, ns, "private-nosecret", regexp.MustCompile(`(?i)unauthenticated|unauthorized|authentication required`))
	t.Logf("a pod without a secret, refused as expected: %s", ev)
	if p := c.Pod(t, ns, "private-nosecret"); p.Status.Phase != corev1.PodPending {
		t.Errorf("the pod without a secret is %s, want Pending", p.Status.Phase)
	}
	for _, d := range refusedDigests {
		if b := harness.BlobsServedIn(t, reg.LogPath, mark)[d]; b != nil {
			t.Errorf("the registry served blob %s of the refused model (%v): the agent or the driver read it for a pod without credentials", d, b.ByClient)
		}
	}
}

// pushPrivate packs dir and pushes it to the private registry as alice; it returns the reference by digest, the
// digests of config and layers, and their total size.
func pushPrivate(t *testing.T, c *harness.Cluster, caFile, dir, repoTag string) (string, []string, int64) {
	t.Helper()
	cmd := exec.Command(c.Modelpack, "pack", dir, "-t", privateRegistry+"/"+repoTag, "--push", "-q", "--ca-file", caFile, "-u", "alice", "-p", "alice-pw")
	cmd.Env = append(os.Environ(), "MODELPACK_HOME="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("modelpack pack --push %s: %v\n%s", repoTag, err, out)
	}
	repo, tag, _ := strings.Cut(repoTag, ":")
	req, _ := http.NewRequest(http.MethodGet, "https://"+privateRegistry+"/v2/"+repo+"/manifests/"+tag, nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	req.SetBasicAuth("alice", "alice-pw")
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: testenv.CertPool(t, caFile)}}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m harness.Manifest
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("manifest of %s: %s %v", repoTag, resp.Status, err)
	}
	digests, total := []string{m.Config.Digest}, m.Config.Size
	for _, l := range m.Layers {
		digests, total = append(digests, l.Digest), total+l.Size
	}
	return privateRegistry + "/" + repo + "@" + resp.Header.Get("Docker-Content-Digest"), digests, total
}

// originCredential gives Kraken's origin a backend for the private registry's repositories (private/…) with its
// own credential, the way deploy/README.md tells users to: the backends list, with security.basic, in a Secret
// passed as --secrets (Kraken merges it over --config); the component's catch-all backend follows it unchanged.
// The origin is restarted with it, and restored after the test.
func originCredential(t *testing.T, c *harness.Cluster) {
	t.Helper()
	var origin struct {
		Backends []map[string]any `json:"backends"`
	}
	if err := yaml.Unmarshal([]byte(c.Kubectl(t, "-n", harness.Namespace, "get", "configmap", "kraken-config", "-o", "jsonpath={.data.origin\\.yaml}")), &origin); err != nil {
		t.Fatal(err)
	}
	backends := append([]map[string]any{{
		"namespace": "private/.*",
		"backend": map[string]any{"registry_blob": map[string]any{
			"address": privateRegistry, "timeout": "5m",
			"security": map[string]any{"tls": map[string]any{"cas": []any{map[string]any{"path": "/etc/kraken-secrets/ca.pem"}}},
				"basic": map[string]any{"username": "alice", "password": "alice-pw"}},
		}},
	}}, origin.Backends...)
	secrets, err := yaml.Marshal(map[string]any{"backends": backends})
	if err != nil {
		t.Fatal(err)
	}
	ca := c.Kubectl(t, "-n", harness.Namespace, "get", "secret", "fleet-private-ca", "-o", "jsonpath={.data.ca\\.pem}")
	c.Apply(t, fmt.Sprintf("apiVersion: v1\nkind: Secret\nmetadata: {name: kraken-origin-secrets, namespace: %s}\nstringData:\n  secrets.yaml: %q\ndata:\n  ca.pem: %s\n", harness.Namespace, secrets, ca))

	var sts struct {
		Spec struct {
			Template struct {
				Spec struct {
					Volumes    []any
					Containers []struct {
						Command      []string
						VolumeMounts []any
					}
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(c.Kubectl(t, "-n", harness.Namespace, "get", "statefulset", "kraken-origin", "-o", "json")), &sts); err != nil {
		t.Fatal(err)
	}
	ps := sts.Spec.Template.Spec
	patch := fmt.Sprintf(`[
{"op":"add","path":"/spec/template/spec/volumes/-","value":{"name":"private-secrets","secret":{"secretName":"kraken-origin-secrets"}}},
{"op":"add","path":"/spec/template/spec/containers/0/volumeMounts/-","value":{"name":"private-secrets","mountPath":"/etc/kraken-secrets","readOnly":true}},
{"op":"add","path":"/spec/template/spec/containers/0/command/-","value":"--secrets=/etc/kraken-secrets/secrets.yaml"}]`)
	undo := fmt.Sprintf(`[
{"op":"remove","path":"/spec/template/spec/containers/0/command/%d"},
{"op":"remove","path":"/spec/template/spec/containers/0/volumeMounts/%d"},
{"op":"remove","path":"/spec/template/spec/volumes/%d"}]`, len(ps.Containers[0].Command), len(ps.Containers[0].VolumeMounts), len(ps.Volumes))
	restart := func(p string) {
		t.Helper()
		c.Kubectl(t, "-n", harness.Namespace, "patch", "statefulset", "kraken-origin", "--type=json", "-p", p)
		c.Kubectl(t, "-n", harness.Namespace, "rollout", "status", "statefulset/kraken-origin", "--timeout=3m")
		c.WaitPod(t, harness.Namespace, "kraken-origin-0", 3*time.Minute, "Ready", func(p *corev1.Pod) bool { return ready(p) })
	}
	restart(patch)
	t.Cleanup(func() { restart(undo) })
}

// waitFailedMount waits for a FailedMount event of the pod whose message matches.
func waitFailedMount(t *testing.T, c *harness.Cluster, ns, name string, message *regexp.Regexp) string {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		for _, e := range c.Events(t, ns, name) {
			if e.Reason == "FailedMount" && message.MatchString(e.Message) {
				return e.Message
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no FailedMount event matching %s for %s/%s: %s", message, ns, name, c.Describe(ns, name))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// trustCA gives every node's driver the private registry's CA (Secret fleet-private-ca) as --ca-file, the way the
// chart's registryCA.secretName does (e2e/cluster's TestRegistryCA checks the chart renders that), and restores
// the DaemonSet after the test; each change waits for the rollout.
func trustCA(t *testing.T, c *harness.Cluster) {
	t.Helper()
	var live struct {
		Spec struct {
			Template struct {
				Spec struct {
					Volumes    []any
					Containers []struct {
						Name         string
						Args         []string
						VolumeMounts []any
					}
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(c.Kubectl(t, "-n", harness.Namespace, "get", "daemonset", "modelpack-node", "-o", "json")), &live); err != nil {
		t.Fatal(err)
	}
	ps := live.Spec.Template.Spec
	i := slices.IndexFunc(ps.Containers, func(c struct {
		Name         string
		Args         []string
		VolumeMounts []any
	}) bool {
		return c.Name == "modelpack"
	})
	if i < 0 {
		t.Fatal("no modelpack container in the node DaemonSet")
	}
	ctr := fmt.Sprintf("/spec/template/spec/containers/%d", i)
	patch := func(ops []map[string]any) {
		t.Helper()
		b, _ := json.Marshal(ops)
		c.Kubectl(t, "-n", harness.Namespace, "patch", "daemonset", "modelpack-node", "--type=json", "-p", string(b))
		c.Kubectl(t, "-n", harness.Namespace, "rollout", "status", "daemonset/modelpack-node", "--timeout=4m")
		for _, n := range c.Nodes {
			if m := nodeMetrics(t, c, n); !strings.Contains(m, "modelpack_") {
				t.Fatalf("node %s: driver not serving after the rollout", n)
			}
		}
	}
	t.Cleanup(func() {
		patch([]map[string]any{
			{"op": "replace", "path": "/spec/template/spec/volumes", "value": ps.Volumes},
			{"op": "replace", "path": ctr + "/volumeMounts", "value": ps.Containers[i].VolumeMounts},
			{"op": "replace", "path": ctr + "/args", "value": ps.Containers[i].Args},
		})
	})
	patch([]map[string]any{
		{"op": "add", "path": "/spec/template/spec/volumes/-", "value": map[string]any{"name": "fleet-private-ca", "secret": map[string]any{"secretName": "fleet-private-ca"}}},
		{"op": "add", "path": ctr + "/volumeMounts/-", "value": map[string]any{"name": "fleet-private-ca", "mountPath": "/etc/modelpack/fleet-private-ca", "readOnly": true}},
		{"op": "add", "path": ctr + "/args/-", "value": "--ca-file=/etc/modelpack/fleet-private-ca/ca.pem"},
	})
}
