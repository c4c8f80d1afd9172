package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// TestDriverMirrorVouchesForNoCaller puts a mirror that serves everything without credentials (as a Kraken agent
// or a pull-through cache does: it reads the origin with the fleet's own credential) in front of a private
// registry. What a mirror serves proves nothing about what the origin serves a caller: a pod without the
// origin's credentials is refused, by digest and by tag, under every pull policy, before the node pulls a byte of
// it through the mirror; a pod with them gets its bytes from the mirror and the origin answers only HEADs.
func TestDriverMirrorVouchesForNoCaller(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	origin := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: htAlice})
	alice := &auth.Credential{Username: "alice", Password: "alice-pw"}
	files := drvSmallModel("private")
	dg := testmodel.Push(t, origin.Host, "models/private", "v1", files, alice)
	// The mirror holds the same content and asks nobody for credentials.
	open := testenv.StartRegistry(t, testenv.RegistryOptions{})
	if got := testmodel.Push(t, open.Host, "models/private", "v1", files, nil); got != dg {
		t.Fatalf("the mirror's copy is %s, want %s", got, dg)
	}
	originProxy, mirror := drvStartProxy(t, origin.Host), drvStartProxy(t, open.Host)

	hosts := filepath.Join(dir, "hosts.d")
	if err := os.MkdirAll(filepath.Join(hosts, originProxy.Host), 0o755); err != nil {
		t.Fatal(err)
	}
	// resolve too, as a pull-through cache is often configured: the mirror then answers tags as well.
	toml := fmt.Sprintf("[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", mirror.Host)
	if err := os.WriteFile(filepath.Join(hosts, originProxy.Host, "hosts.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	d := drvStartWith(t, filepath.Join(dir, "node"), []string{"--hosts-dir", hosts}, originProxy.Host, mirror.Host)
	v := &drvVolumes{t: t, dir: dir, node: d.node(), want: "weights of private"}

	tag := originProxy.Host + "/models/private:v1"
	byDigest := originProxy.Host + "/models/private@" + dg.String()
	sAlice := drvSecret(originProxy.Host, "alice", "alice-pw")
	sWrong := drvSecret(originProxy.Host, "alice", "not-her-password")
	sMirror := drvSecret(mirror.Host, "alice", "alice-pw") // a secret for the mirror's host is not the origin's

	// Cold: the mirror would serve it all; the origin refuses these callers, so nothing is pulled.
	for _, ref := range []string{byDigest, tag} {
		for _, secret := range []map[string]string{nil, sWrong, sMirror} {
			v.refused(ref, "IfNotPresent", secret, codes.Unauthenticated, "")
			v.refused(ref, "Always", secret, codes.Unauthenticated, "")
		}
	}
	if n := mirror.totalBlobGets(); n != 0 {
		t.Fatalf("callers the origin refuses made the node read %d blobs through the mirror, want 0", n)
	}

	// The origin's own user: the bytes come from the mirror, the origin is asked whether it serves them.
	v.must(byDigest, "IfNotPresent", sAlice)
	if n := mirror.totalBlobGets(); n != len(files)+1 {
		t.Fatalf("the mirror served %d blob GETs, want %d (every layer and the config)", n, len(files)+1)
	}
	if n := originProxy.totalBlobGets(); n != 0 {
		t.Fatalf("the origin served %d blob GETs, want 0 (HEADs only)", n)
	}

	v.must(tag, "IfNotPresent", sAlice)

	// Warm: the node holds it now, and still hands it to nobody the origin refuses.
	for _, ref := range []string{byDigest, tag} {
		for _, policy := range []string{"IfNotPresent", "Never", "Always"} {
			for _, secret := range []map[string]string{nil, sWrong, sMirror} {
				v.refused(ref, policy, secret, codes.Unauthenticated, "")
			}
		}
	}
	v.must(byDigest, "Never", sAlice)
	if n := originProxy.totalBlobGets(); n != 0 {
		t.Fatalf("the origin served %d blob GETs, want 0 (HEADs only)", n)
	}
}
