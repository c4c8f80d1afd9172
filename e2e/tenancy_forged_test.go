package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc/codes"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// fetchManifest reads a manifest's bytes from a real registry with cred.
func fetchManifest(t *testing.T, host, repo, ref string, cred auth.Credential) ([]byte, ocispec.Manifest) {
	t.Helper()
	r, err := remote.NewRepository(host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	r.PlainHTTP = true
	r.Client = &auth.Client{Credential: auth.StaticCredential(host, cred)}
	_, b, err := oras.FetchBytes(context.Background(), r, ref, oras.DefaultFetchBytesOptions)
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return b, m
}

// A digest is not a key. Tenant A mounts a private model from an htpasswd registry; an attacker who knows its
// digests (a gated Hub model's LFS oids are its sha256s) but none of its bytes or credentials serves, from a
// registry of its own, a manifest listing A's layers with a config of its own, and the very bytes of A's
// manifest, answering 404 for every blob. Tenant B, with no secret, publishes them by tag and by digest, under
// every pull policy and in each verification mode: refused (NOT_FOUND, naming a blob the registry does not
// serve), nothing mounted, and the attacker's registry was sent none of A's bytes (it is asked whether it has
// them, which tells it nothing it did not know).
func TestDriverLendsNoBlobToAManifestWhoseRegistryCannotServeIt(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: htAlice})
	alice := auth.Credential{Username: "alice", Password: "alice-pw"}
	dg := testmodel.Push(t, reg.Host, "models/private", "v1", drvSmallModel("private"), &alice)
	privateBytes, private := fetchManifest(t, reg.Host, "models/private", "v1", alice)

	evil := testenv.StartHostileRegistry(t)
	cfg := evil.Blob(private.Config.MediaType, []byte(`{"descriptor":{"name":"not yours"},"config":{},"modelfs":{"type":"layers","diffIds":[]}}`))
	forged := evil.Manifest(t, "v1", ocispec.Manifest{Versioned: specsV2, MediaType: ocispec.MediaTypeImageManifest,
		ArtifactType: private.ArtifactType, Config: cfg, Layers: private.Layers}, ocispec.MediaTypeImageManifest)
	copied := evil.Raw("copy", ocispec.MediaTypeImageManifest, privateBytes)
	if copied.Digest != dg {
		t.Fatalf("the copied manifest is %s, want %s", copied.Digest, dg)
	}
	// The same registry, another repository (that a registry stores blobs once is no grant either).
	refs := map[string][]string{
		evil.Host + "/evil/other:v1":                        {"IfNotPresent", "Always"},
		evil.Host + "/evil/other@" + forged.Digest.String(): {"IfNotPresent", "Always", "Never"},
		evil.Host + "/evil/other:copy":                      {"IfNotPresent", "Always"},
		evil.Host + "/evil/other@" + dg.String():            {"IfNotPresent", "Always", "Never"},
	}
	for i, mode := range []string{"NeverVerify", "NeverVerifyPreloadedImages", "AlwaysVerify"} {
		t.Run(mode, func(t *testing.T) {
			root := filepath.Join(dir, fmt.Sprint(i)) // short: a unix socket's path has 108 bytes
			d := drvStartWith(t, root, []string{"--image-pull-credentials-verification-policy", mode}, reg.Host, evil.Host)
			defer d.stop()
			v := &drvVolumes{t: t, dir: filepath.Join(root, "kubelet"), node: d.node(), want: "weights of private"}
			v.must(reg.Host+"/models/private:v1", "IfNotPresent", drvSecret(reg.Host, "alice", "alice-pw"))
			for ref, policies := range refs {
				for _, policy := range policies {
					for _, secrets := range []map[string]string{nil, drvSecret(evil.Host, "mallory", "x")} {
						err := v.publish(ref, policy, secrets)
						drvWantCode(t, err, codes.NotFound, "does not serve")
					}
				}
			}
			// A's own model for B's secret-less pod: the registry refuses it (NeverVerify shares it by design).
			if mode != "NeverVerify" {
				v.refused(reg.Host+"/models/private@"+dg.String(), "Never", nil, codes.Unauthenticated, "")
			}
		})
	}
	for _, l := range private.Layers {
		if n := evil.Gets(l.Digest); n != 0 {
			t.Fatalf("the attacker's registry was sent %d GETs of %s", n, l.Digest)
		}
	}
}

// The node's credentials vouch for the node's own pulls only. A private model prepulled with them (the node's
// docker config) is open to pods as the verification mode says, and to no pod merely because it names no secret:
// every mode × {no secret, wrong secret, right secret} × {IfNotPresent, Never, Always}, in an order where each
// publish comes after every other (so no earlier success can widen what a later caller gets). A wrong secret never
// gets more than no secret.
func TestDriverNodeCredentialsVouchOnlyForTheNodesOwnPulls(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: htAlice + htBob})
	alice := auth.Credential{Username: "alice", Password: "alice-pw"}
	testmodel.Push(t, reg.Host, "models/private", "v1", drvSmallModel("private"), &alice)
	model := reg.Host + "/models/private:v1"
	nodeConfig := filepath.Join(dir, "node.json")
	if err := os.WriteFile(nodeConfig, []byte(testenv.DockerConfigJSON(reg.Host, "alice", "alice-pw")), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := testenv.Modelpack(t)

	for i, tc := range []struct {
		mode  string
		extra []string
		// exempt: the prepulled model is open to callers the registry does not serve (no or a wrong secret).
		exempt bool
	}{
		{"NeverVerify", nil, true},
		{"NeverVerifyPreloadedImages", nil, true},
		{"NeverVerifyAllowlistedImages", []string{"--preloaded-images-verification-allowlist", reg.Host + "/other/*"}, false},
		{"NeverVerifyAllowlistedImages", []string{"--preloaded-images-verification-allowlist", reg.Host + "/models/*"}, true},
		{"AlwaysVerify", nil, false},
	} {
		name := strings.ReplaceAll(tc.mode+strings.Join(tc.extra, ""), "/", "_")
		t.Run(name, func(t *testing.T) {
			root := filepath.Join(dir, fmt.Sprint(i))
			args := append([]string{"--registry-config", nodeConfig, "--image-pull-credentials-verification-policy", tc.mode}, tc.extra...)
			d := drvStartWith(t, root, args, reg.Host)
			defer d.stop()
			if out, err := exec.Command(bin, "prepull", "--socket", filepath.Join(d.Root, "prepull.sock"), "-q", model).CombinedOutput(); err != nil {
				t.Fatalf("prepull: %v\n%s", err, out)
			}
			v := &drvVolumes{t: t, dir: filepath.Join(root, "kubelet"), node: d.node(), want: "weights of private"}
			secrets := map[string]map[string]string{
				"right": drvSecret(reg.Host, "bob", "bob-pw"),
				"none":  nil,
				"wrong": drvSecret(reg.Host, "bob", "not-his-password"),
			}
			// Twice round: the second proves no publish of the first widened anything.
			for round := 0; round < 2; round++ {
				for _, who := range []string{"right", "none", "wrong"} {
					// What the registry serves the pod's own request: its secret, or under NeverVerify only, the
					// node's credentials for a pod with none.
					served := who == "right" || (who == "none" && tc.mode == "NeverVerify")
					for _, policy := range []string{"IfNotPresent", "Never", "Always"} {
						err := v.publish(model, policy, secrets[who])
						if served || (tc.exempt && policy != "Always") {
							if err != nil {
								t.Fatalf("round %d, %s secret, %s: %v, want a mount", round, who, policy, err)
							}
							continue
						}
						drvWantCode(t, err, codes.Unauthenticated, "")
					}
				}
			}
		})
	}
}
