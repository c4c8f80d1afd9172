package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"

	"github.com/modelpack/modelpack/internal/testenv"
)

const omsVectors = "../signing/oms/testdata/vectors"

// TestDriverVerifiesOMS runs the real driver with an OMS rule against a real registry: a model directory signed
// by OpenSSF Model Signing's reference implementation (its published vector, model.sig beside the files) is packed
// with the modelpack CLI and mounts; the same model with one byte changed on disk before packing, or with a file
// added, is refused with PERMISSION_DENIED naming the file and the rule, and none of its model layers is fetched.
// A model signed with `modelpack sign --format oms` (a referrer) mounts under a key rule.
func TestDriverVerifiesOMS(t *testing.T) {
	// No cosign here: the reference's signature and modelpack's own are all this needs.
	home := t.TempDir()
	e := &sigEnv{t: t, mp: testenv.Modelpack(t), dir: t.TempDir(), reg: testenv.StartRegistry(t, testenv.RegistryOptions{})}
	e.host = e.reg.Host
	e.env = append(os.Environ(), "HOME="+home, "DOCKER_CONFIG="+filepath.Join(home, ".docker"), "MODELPACK_HOME="+filepath.Join(home, "store"), "COSIGN_PASSWORD="+sigPassword)
	proxy := drvStartProxy(t, e.host)
	vec, _ := filepath.Abs(filepath.Join(omsVectors, "v1.0.0-certificate"))
	ca, _ := filepath.Abs(filepath.Join(omsVectors, "keys/ca-cert.pem"))

	copyVec := func(name string) string {
		dst := filepath.Join(e.dir, name)
		if err := os.CopyFS(dst, os.DirFS(vec)); err != nil {
			t.Fatal(err)
		}
		return dst
	}
	pack := func(dir, repo string) {
		e.must(e.mp, "pack", dir, "-t", proxy.Host+"/"+repo+":v1", "--push", "--plain-http")
	}
	pack(copyVec("good"), "oms/good")

	tampered := copyVec("tampered")
	dd := exec.Command("dd", "of="+filepath.Join(tampered, "signme-1"), "bs=1", "seek=1", "count=1", "conv=notrunc", "status=none")
	dd.Stdin = strings.NewReader("Z")
	if out, err := dd.CombinedOutput(); err != nil {
		t.Fatalf("dd: %v %s", err, out)
	}
	tamperedBytes, err := os.ReadFile(filepath.Join(tampered, "signme-1"))
	if err != nil {
		t.Fatal(err)
	}
	pack(tampered, "oms/tampered")

	added := copyVec("added")
	extra := []byte("weights nobody signed")
	if err := os.WriteFile(filepath.Join(added, "extra.safetensors"), extra, 0o644); err != nil {
		t.Fatal(err)
	}
	pack(added, "oms/added")

	// Signed by modelpack: the cosign key pair signs the files, the signature travels as a referrer.
	e.must(e.mp, "key", "generate", "--output-key-prefix", filepath.Join(e.dir, "oms"))
	plain := filepath.Join(e.dir, "plain")
	if err := os.MkdirAll(plain, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(plain, "model.safetensors"), []byte("weights signed by modelpack"), 0o644); err != nil {
		t.Fatal(err)
	}
	pack(plain, "oms/modelpack")
	e.must(e.mp, "sign", proxy.Host+"/oms/modelpack:v1", "--key", filepath.Join(e.dir, "oms.key"), "--format", "oms", "--plain-http")

	policy := filepath.Join(e.dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`default: {mode: enforce, none: true}
rules:
- name: oms-models
  match: ["%s/oms/**"]
  oms:
    certificateChains: [%s]
    keys: [%s]
`, proxy.Host, ca, filepath.Join(e.dir, "oms.pub"))), 0o644); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	drvCleanupMounts(t, root)
	p := drvStartWith(t, root, []string{"--policy", policy}, proxy.Host)
	node := p.node()
	publish := func(pod, repo string) (string, error) {
		target := drvKubelet(t, root, pod)
		a := map[string]string{"reference": proxy.Host + "/" + repo + ":v1", "csi.storage.k8s.io/ephemeral": "true"}
		return target, drvPublish(node, testenv.PublishRequest("vol-"+pod, target, a), time.Minute)
	}

	target, err := publish("good", "oms/good")
	if err != nil {
		t.Fatalf("a model signed by the OMS reference implementation: %v", err)
	}
	for _, f := range []string{"signme-1", "signme-2"} {
		want, _ := os.ReadFile(filepath.Join(vec, f))
		if got := drvRead(t, filepath.Join(target, f)); got != string(want) {
			t.Fatalf("mounted %s = %q, want %q", f, got, want)
		}
	}
	target2, err := publish("modelpack", "oms/modelpack")
	if err != nil {
		t.Fatalf("a model signed with modelpack sign --format oms: %v", err)
	}
	if got := drvRead(t, filepath.Join(target2, "model.safetensors")); got != "weights signed by modelpack" {
		t.Fatalf("mounted %q", got)
	}

	for _, c := range []struct {
		pod, repo, file string
		layer           []byte
	}{
		{"tampered", "oms/tampered", `file "signme-1" has digest`, tamperedBytes},
		{"added", "oms/added", `file "extra.safetensors" is not listed in the signature`, extra},
	} {
		target, err := publish(c.pod, c.repo)
		drvWantCode(t, err, codes.PermissionDenied, c.file)
		if !strings.Contains(err.Error(), `rule "oms-models"`) || !strings.Contains(err.Error(), "model does not match its OMS signature") {
			t.Fatalf("%s: the refusal does not name the rule and the reason: %v", c.pod, err)
		}
		if m, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(m), target) {
			t.Fatalf("%s: refused volume is mounted", c.pod)
		}
		if n := proxy.blobGetsOf(digest.FromBytes(c.layer)); n != 0 {
			t.Fatalf("%s: %d GETs of the offending layer before verification", c.pod, n)
		}
	}
	drvUnpublish(t, node, "vol-good", target)
	drvUnpublish(t, node, "vol-modelpack", target2)
}
