package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// Users of the private registry (bcrypt, cost 4): alice with her password before and after a rotation, bob.
const (
	htAlice        = "alice:$2a$04$P09zfd9asiwL8MD/kWd2IO1G4iks7bnazfTKEiuYHe8cEiFnIrf8u\n"
	htAliceRotated = "alice:$2a$04$JNHmFpEy3kKjmbL0AGoADOXoQ/AnJWmQnlqjxvzt3PpA4UKtJooOe\n"
	htBob          = "bob:$2a$04$XQdIk/F2F..f9SqvQdra1.5qPqi0xfxFnQSLsWARQvUnvHBm8W5aW\n"
)

// totalBlobGets is every blob GET the proxy saw.
func (p *drvProxy) totalBlobGets() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.blobGets {
		n += c
	}
	return n
}

// drvVolumes publishes volumes as kubelet does, each in a pod and namespace of its own, checks that a success
// mounted want and a refusal left no target behind, and unpublishes.
type drvVolumes struct {
	t    *testing.T
	dir  string
	node csi.NodeClient
	want string // model.safetensors of a mounted volume
	pod  int
}

func (v *drvVolumes) publish(ref, policy string, secrets map[string]string) error {
	v.t.Helper()
	v.pod++
	target := drvKubelet(v.t, v.dir, fmt.Sprint("pod-", v.pod))
	req := testenv.PublishRequest(fmt.Sprint("vol-", v.pod), target, map[string]string{
		"reference": ref, "pullPolicy": policy, "csi.storage.k8s.io/pod.namespace": fmt.Sprint("ns-", v.pod)})
	req.Secrets = secrets
	if err := drvPublish(v.node, req, time.Minute); err != nil {
		if _, serr := os.Stat(target); !errors.Is(serr, os.ErrNotExist) {
			v.t.Fatalf("a refused publish of %s left %s behind", ref, target)
		}
		return err
	}
	if got := drvRead(v.t, filepath.Join(target, "model.safetensors")); got != v.want {
		v.t.Fatalf("%s mounted %q", ref, got)
	}
	drvUnpublish(v.t, v.node, fmt.Sprint("vol-", v.pod), target)
	return nil
}

func (v *drvVolumes) must(ref, policy string, secrets map[string]string) {
	v.t.Helper()
	if err := v.publish(ref, policy, secrets); err != nil {
		v.t.Fatalf("%s (%s): %v", ref, policy, err)
	}
}

func (v *drvVolumes) refused(ref, policy string, secrets map[string]string, code codes.Code, contains string) {
	v.t.Helper()
	drvWantCode(v.t, v.publish(ref, policy, secrets), code, contains)
}

func drvSecret(host, user, pass string) map[string]string {
	return map[string]string{".dockerconfigjson": testenv.DockerConfigJSON(host, user, pass)}
}

// A private model one tenant pulled is mounted for another volume only if the registry serves it to that volume's
// credentials, whatever the pull policy and however it is named; a second tenant with valid credentials gets it
// with manifest requests only (zero blob GETs); the records survive a driver restart; a rotated password is
// checked once.
func TestDriverCachedModelOnlyForCallersTheRegistryServes(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	regDir := t.TempDir()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: htAlice + htBob, Dir: regDir})
	alice := &auth.Credential{Username: "alice", Password: "alice-pw"}
	bob := &auth.Credential{Username: "bob", Password: "bob-pw"}
	files := drvSmallModel("private")
	dg := testmodel.Push(t, reg.Host, "models/private", "v1", files, alice)
	testmodel.Push(t, reg.Host, "models/other", "v1", drvSmallModel("other"), alice)
	// A second registry host with its own users holds the same digest.
	reg2 := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: htBob})
	if dg2 := testmodel.Push(t, reg2.Host, "models/private", "v1", files, bob); dg2 != dg {
		t.Fatalf("the second registry's copy is %s, want %s", dg2, dg)
	}
	proxy, proxy2 := drvStartProxy(t, reg.Host), drvStartProxy(t, reg2.Host)
	root := filepath.Join(dir, "node")
	d := drvStart(t, root, proxy.Host, proxy2.Host)
	node := d.node()

	secret := drvSecret
	var (
		tag       = proxy.Host + "/models/private:v1"
		byDigest  = proxy.Host + "/models/private@" + dg.String()
		sAlice    = secret(proxy.Host, "alice", "alice-pw")
		sBob      = secret(proxy.Host, "bob", "bob-pw")
		sWrong    = secret(proxy.Host, "alice", "not-her-password")
		sStranger = secret(proxy.Host, "mallory", "mallory-pw")
	)
	v := &drvVolumes{t: t, dir: dir, node: node, want: "weights of private"}
	must, refused := v.must, v.refused
	must(tag, "IfNotPresent", sAlice)
	pulled := proxy.totalBlobGets()
	if pulled != len(files)+1 {
		t.Fatalf("the first pull made %d blob GETs, want %d", pulled, len(files)+1)
	}

	// No, wrong and unknown credentials: refused under every pull policy, by tag and by digest; nothing read.
	for _, ref := range []string{tag, byDigest} {
		for _, policy := range []string{"IfNotPresent", "Never", "Always"} {
			refused(ref, policy, nil, codes.Unauthenticated, "")
			refused(ref, policy, sWrong, codes.Unauthenticated, "")
			refused(ref, policy, sStranger, codes.Unauthenticated, "")
		}
	}
	// The pod's event says why: the model is here, and the registry did not confirm this volume's credentials.
	refused(byDigest, "Never", nil, codes.Unauthenticated, "is on this node, but it is shared only with callers its registry serves it to, and the check for no credentials (no pull secret for this registry")
	refused(tag, "Never", sWrong, codes.Unauthenticated, "the pull secret of a volume in namespace ns-")

	// Another tenant with its own valid credentials: manifest requests only.
	manifests := proxy.manifestRequests()
	must(byDigest, "Never", sBob)
	// One check: a HEAD of the manifest, answered 401 first when the client has not yet learnt the scheme.
	if n := proxy.manifestRequests() - manifests; n < 1 || n > 2 {
		t.Fatalf("the second tenant's first publish made %d manifest requests, want one check (1 or 2 requests)", n)
	}
	manifests = proxy.manifestRequests()
	for _, ref := range []string{tag, byDigest} {
		must(ref, "IfNotPresent", sBob)
		must(ref, "Never", sBob)
		must(ref, "Never", sAlice)
	}
	if n := proxy.manifestRequests() - manifests; n != 0 {
		t.Fatalf("warm publishes of recorded tenants made %d manifest requests, want 0", n)
	}
	must(tag, "Always", sBob)
	must(byDigest, "Always", sBob)

	// The same digest under another repository: that repository does not serve it.
	for _, policy := range []string{"IfNotPresent", "Never", "Always"} {
		refused(proxy.Host+"/models/other@"+dg.String(), policy, sAlice, codes.NotFound, "")
	}
	// Under another registry host: that registry's own users decide.
	other := proxy2.Host + "/models/private@" + dg.String()
	for _, policy := range []string{"IfNotPresent", "Never", "Always"} {
		refused(other, policy, nil, codes.Unauthenticated, "")
		refused(other, policy, secret(proxy2.Host, "alice", "alice-pw"), codes.Unauthenticated, "")
	}
	must(other, "Never", secret(proxy2.Host, "bob", "bob-pw"))
	must(other, "IfNotPresent", secret(proxy2.Host, "bob", "bob-pw"))
	// An attacker's host that does not even answer.
	for _, policy := range []string{"IfNotPresent", "Never"} {
		refused("attacker.invalid/models/private@"+dg.String(), policy, sAlice, codes.Unavailable, "attacker.invalid")
	}
	if n, n2 := proxy.totalBlobGets(), proxy2.totalBlobGets(); n != pulled || n2 != 0 {
		t.Fatalf("blob GETs after the first pull: %d from the registry, %d from the second; want none", n-pulled, n2)
	}

	// The records survive a restart.
	d.stop()
	d.restart()
	v.node = d.node()
	manifests = proxy.manifestRequests()
	must(byDigest, "Never", sBob)
	must(tag, "IfNotPresent", sAlice)
	if n := proxy.manifestRequests() - manifests; n != 0 {
		t.Fatalf("recorded tenants made %d manifest requests after a restart, want 0", n)
	}
	refused(tag, "Never", nil, codes.Unauthenticated, "")
	refused(tag, "IfNotPresent", sStranger, codes.Unauthenticated, "")

	// Alice's password is rotated at the registry: her new secret matches no record and is checked once.
	reg.Stop()
	testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: htAliceRotated + htBob, Dir: regDir, Addr: reg.Host})
	sAliceNew := secret(proxy.Host, "alice", "alice-pw-2")
	manifests = proxy.manifestRequests()
	must(tag, "Never", sAliceNew)
	must(byDigest, "Never", sAliceNew)
	if n := proxy.manifestRequests() - manifests; n < 1 || n > 2 {
		t.Fatalf("a rotated credential made %d manifest requests, want one check (1 or 2 requests)", n)
	}
	refused(tag, "Always", sAlice, codes.Unauthenticated, "")
	if n := proxy.totalBlobGets(); n != pulled {
		t.Fatalf("%d blob GETs after the first pull, want none", n-pulled)
	}
	drvNoSecret(t, root, testenv.DockerConfigJSON(proxy.Host, "alice", "alice-pw"), "alice:alice-pw", "alice-pw")
}
