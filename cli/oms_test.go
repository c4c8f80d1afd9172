package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

const omsVectors = "../signing/oms/testdata/vectors"

// copyDir copies a vector folder so a test can damage it.
func copyOMSVector(t *testing.T, name string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), name)
	if err := os.CopyFS(dst, os.DirFS(filepath.Join(omsVectors, name))); err != nil {
		t.Fatal(err)
	}
	return dst
}

// ddFlip overwrites one byte in place with dd conv=notrunc, as someone with write access to the files would.
func ddFlip(t *testing.T, file string) {
	t.Helper()
	cmd := exec.Command("dd", "of="+file, "bs=1", "seek=2", "count=1", "conv=notrunc", "status=none")
	cmd.Stdin = strings.NewReader("Z")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("dd: %v %s", err, out)
	}
}

// verify --oms checks a model directory as model_signing verify does: the reference's vectors pass, a changed
// byte is refused naming the file.
func TestVerifyOMSDir(t *testing.T) {
	run := binaryRunner(t, "MODELPACK_HOME="+t.TempDir())
	keys, _ := filepath.Abs(filepath.Join(omsVectors, "keys"))
	for _, c := range []struct {
		dir  string
		args []string
	}{
		{"v1.0.1-certificate", []string{"--certificate-chain", filepath.Join(keys, "ca-cert.pem"), "--ignore-paths", "ignore-me"}},
		{"v1.1.0-elliptic-key", []string{"--key", filepath.Join(keys, "signing-key-pub.pem")}},
	} {
		dir := copyOMSVector(t, c.dir)
		if code, out, errOut := run(append([]string{"verify", "--oms", dir}, c.args...)...); code != 0 || !strings.Contains(out, "Verified") {
			t.Fatalf("%s: exit %d %s %s", c.dir, code, out, errOut)
		}
		ddFlip(t, filepath.Join(dir, "signme-2"))
		code, _, errOut := run(append([]string{"verify", "--oms", dir}, c.args...)...)
		if code == 0 || !strings.Contains(errOut, `file "signme-2" has digest`) {
			t.Fatalf("%s tampered: exit %d, %s", c.dir, code, errOut)
		}
	}
}

// An OMS-signed directory packs with its model.sig as a layer; verify --format oms checks the artifact from its
// manifest. A model signed with modelpack sign --format oms carries the signature as a referrer.
func TestPackVerifySignOMS(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir(), "MODELPACK_HOME="+t.TempDir(), "COSIGN_PASSWORD=pw")
	ca, _ := filepath.Abs(filepath.Join(omsVectors, "keys/ca-cert.pem"))

	good := copyOMSVector(t, "v1.0.0-certificate")
	if code, _, errOut := run("pack", good, "-t", reg.Host+"/oms/good:v1", "--push", "--plain-http"); code != 0 {
		t.Fatalf("pack: %s", errOut)
	}
	code, out, errOut := run("verify", reg.Host+"/oms/good:v1", "--format", "oms", "--certificate-chain", ca, "--plain-http", "-o", "json")
	if code != 0 || decodeOne(t, "verify", out)["verified"] != true || !strings.Contains(out, "layer model.sig") {
		t.Fatalf("verify --format oms of a packed vector: exit %d %s %s", code, out, errOut)
	}

	bad := copyOMSVector(t, "v1.0.0-certificate")
	ddFlip(t, filepath.Join(bad, "signme-1"))
	if code, _, errOut := run("pack", bad, "-t", reg.Host+"/oms/bad:v1", "--push", "--plain-http"); code != 0 {
		t.Fatalf("pack: %s", errOut)
	}
	code, _, errOut = run("verify", reg.Host+"/oms/bad:v1", "--format", "oms", "--certificate-chain", ca, "--plain-http")
	if code == 0 || !strings.Contains(errOut, `file "signme-1" has digest`) {
		t.Fatalf("verify of a tampered packed vector: exit %d, %s", code, errOut)
	}

	keys := filepath.Join(t.TempDir(), "cosign")
	if code, _, errOut := run("key", "generate", "--output-key-prefix", keys); code != 0 {
		t.Fatalf("key generate: %s", errOut)
	}
	ref := reg.Host + "/oms/plain:v1"
	if code, _, errOut := run("pack", smallModel(t), "-t", ref, "--push", "--plain-http"); code != 0 {
		t.Fatalf("pack: %s", errOut)
	}
	if code, _, _ := run("verify", ref, "--format", "oms", "--key", keys+".pub", "--plain-http"); code == 0 {
		t.Fatal("verify --format oms passed before any OMS signature")
	}
	if code, out, errOut := run("sign", ref, "--key", keys+".key", "--format", "oms", "--plain-http"); code != 0 || !strings.Contains(out, "referrer sha256:") {
		t.Fatalf("sign --format oms: exit %d %s %s", code, out, errOut)
	}
	if code, out, errOut := run("verify", ref, "--format", "oms", "--key", keys+".pub", "--plain-http"); code != 0 || !strings.Contains(out, "Verified") {
		t.Fatalf("verify of modelpack's OMS signature: exit %d %s %s", code, out, errOut)
	}
}
