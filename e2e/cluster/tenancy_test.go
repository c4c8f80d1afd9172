//go:build cluster

package cluster

import (
	"encoding/json"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
	"github.com/modelpack/modelpack/internal/testenv"
)

// authRegistry is where tests of tenants start their own registry with htpasswd (env.sh AUTH_REGISTRY_PORT; the
// local-cluster overlay lists it as plain HTTP), so the shared registry stays open for the other tests.
const authRegistry = "127.0.0.1:25001"

// Users of the private registry (bcrypt, cost 4): alice of tenant A, bob of tenant B.
const tenantHtpasswd = "alice:$2a$04$P09zfd9asiwL8MD/kWd2IO1G4iks7bnazfTKEiuYHe8cEiFnIrf8u\n" +
	"bob:$2a$04$XQdIk/F2F..f9SqvQdra1.5qPqi0xfxFnQSLsWARQvUnvHBm8W5aW\n"

// TestTenants: a private model pulled for tenant A's pod (namespace tenant-a, its pull secret) is not mounted for
// tenant B's pod without a secret: FailedMount names the reason, the container never starts, the registry serves
// no blob. Tenant B's pod with its own valid secret then runs and reads the model from the node with zero blob
// GETs (one manifest check).
func TestTenants(t *testing.T) {
	c := harness.Connect(t)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: tenantHtpasswd, Addr: authRegistry, AccessLog: true})
	src := genModel(t, 901, 2)
	ref := pushPrivate(t, c, reg, src, "e2e/tenant:v1", "alice", "alice-pw")

	for _, ns := range []string{"tenant-a", "tenant-b"} {
		c.Kubectl(t, "create", "namespace", ns)
		t.Cleanup(func() { c.Run("delete", "namespace", ns, "--wait=false") })
	}
	c.Kubectl(t, "-n", "tenant-a", "create", "secret", "docker-registry", "pull", "--docker-server="+authRegistry,
		"--docker-username=alice", "--docker-password=alice-pw")

	const mnt = "/models/m"
	pod := func(ns, name, secret string) {
		t.Helper()
		c.Apply(t, c.PodManifest(harness.PodSpec{Name: name, Namespace: ns, Script: harness.SumScript(mnt),
			Volumes: []harness.Volume{{Name: "model", MountPath: mnt, SecretRef: secret,
				CSI: map[string]string{"reference": ref, "pullPolicy": "IfNotPresent"}}}}))
	}
	reads := func(ns, name string) {
		t.Helper()
		c.WaitPhase(t, ns, name, corev1.PodSucceeded, podTimeout)
		if got, want := harness.ParseSums(t, c.Logs(t, ns, name, ""), mnt), harness.TreeSums(t, src); !maps.Equal(got, want) {
			t.Errorf("%s/%s read other bytes than the source:\ngot  %v\nwant %v", ns, name, got, want)
		}
	}

	pod("tenant-a", "a", "pull")
	reads("tenant-a", "a")

	mark := harness.MarkLog(t, reg.LogPath)
	pod("tenant-b", "b-nosecret", "")
	event := waitEvent(t, c, "tenant-b", "b-nosecret", "FailedMount",
		regexp.MustCompile(`is on this node, but it is shared only with callers its registry serves it to.*(unauthorized|authentication required)`))
	t.Logf("tenant B without a secret, refused as expected: %s", event)
	if p := c.Pod(t, "tenant-b", "b-nosecret"); !harness.NotStarted(p) {
		t.Errorf("tenant B's pod without a secret: want Pending in ContainerCreating, got %s %+v", p.Status.Phase, p.Status.ContainerStatuses)
	}
	c.Kubectl(t, "-n", "tenant-b", "create", "secret", "docker-registry", "pull", "--docker-server="+authRegistry,
		"--docker-username=bob", "--docker-password=bob-pw")
	pod("tenant-b", "b", "pull")
	reads("tenant-b", "b")
	if gets := harness.BlobGETsIn(t, reg.LogPath, mark); len(gets) != 0 {
		t.Errorf("tenant B cost blob GETs %v, want none (the node holds the model)", gets)
	}
}

// pushPrivate packs dir and pushes it to reg as user; it returns the reference by digest.
func pushPrivate(t *testing.T, c *harness.Cluster, reg *testenv.Registry, dir, repoTag, user, password string) string {
	t.Helper()
	return pushTo(t, c, dir, "http://"+reg.Host, http.DefaultClient, repoTag, user, password, "--plain-http", "-u", user, "-p", password)
}

// pushTo packs dir and pushes it with `modelpack pack --push` and flags to the registry at base (scheme://host),
// then reads the manifest's digest back through client (as user, if given); it returns the reference by digest.
func pushTo(t *testing.T, c *harness.Cluster, dir, base string, client *http.Client, repoTag, user, password string, flags ...string) string {
	t.Helper()
	host := strings.TrimPrefix(strings.TrimPrefix(base, "http://"), "https://")
	tagged := host + "/" + repoTag
	cmd := exec.Command(c.Modelpack, append([]string{"pack", dir, "-t", tagged, "--push", "-q"}, flags...)...)
	cmd.Env = append(os.Environ(), "MODELPACK_HOME="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("modelpack pack --push %s: %v\n%s", tagged, err, out)
	}
	repo, tag, _ := strings.Cut(repoTag, ":")
	req, _ := http.NewRequest(http.MethodGet, base+"/v2/"+repo+"/manifests/"+tag, nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m harness.Manifest
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != http.StatusOK || len(m.Layers) == 0 {
		t.Fatalf("manifest of %s: %s %v", tagged, resp.Status, err)
	}
	return host + "/" + repo + "@" + resp.Header.Get("Docker-Content-Digest")
}
