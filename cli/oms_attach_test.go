package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// sign REF --oms FILE attaches a signature model_signing made (the reference's own v1.1.0 vector, signed with its
// elliptic key) to a registry artifact of those files, as the OMS referrer verify and the node read; a signature
// of other bytes is refused naming the file, and nothing is attached.
func TestSignAttachOMSFile(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir(), "MODELPACK_HOME="+t.TempDir())
	pub, _ := filepath.Abs(filepath.Join(omsVectors, "keys", "signing-key-pub.pem"))
	sig := filepath.Join(t.TempDir(), "model.sig")
	model := copyOMSVector(t, "v1.1.0-elliptic-key")
	if err := os.Rename(filepath.Join(model, "model.sig"), sig); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(model, "ignore-me")) // the statement ignores it: not part of the model
	ref := reg.Host + "/oms/attached:v1"
	if code, _, errOut := run("pack", model, "-t", ref, "--push", "--plain-http"); code != 0 {
		t.Fatalf("pack: %s", errOut)
	}
	if code, _, _ := run("verify", ref, "--format", "oms", "--key", pub, "--plain-http"); code == 0 {
		t.Fatal("verified before the signature was attached")
	}
	code, out, errOut := run("sign", ref, "--oms", sig, "--plain-http")
	if code != 0 || !strings.Contains(out, "Attached the OMS signature "+sig) {
		t.Fatalf("sign --oms FILE: exit %d %s %s", code, out, errOut)
	}
	code, out, errOut = run("verify", ref, "--format", "oms", "--key", pub, "--plain-http", "-o", "json")
	if code != 0 || decodeOne(t, "verify", out)["verified"] != true {
		t.Fatalf("verify after attaching: exit %d %s %s", code, out, errOut)
	}

	bad := copyOMSVector(t, "v1.1.0-elliptic-key")
	os.Remove(filepath.Join(bad, "model.sig"))
	os.Remove(filepath.Join(bad, "ignore-me"))
	ddFlip(t, filepath.Join(bad, "signme-2"))
	badRef := reg.Host + "/oms/other:v1"
	if code, _, errOut := run("pack", bad, "-t", badRef, "--push", "--plain-http"); code != 0 {
		t.Fatalf("pack: %s", errOut)
	}
	code, _, errOut = run("sign", badRef, "--oms", sig, "--plain-http")
	if code != 1 || !strings.Contains(errOut, "does not match") || !strings.Contains(errOut, `"signme-2"`) {
		t.Fatalf("attaching another model's signature: exit %d %s", code, errOut)
	}
	if code, _, _ := run("verify", badRef, "--format", "oms", "--key", pub, "--plain-http"); code == 0 {
		t.Fatal("a refused signature was attached anyway")
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sign", "--oms", sig}, "is a signature file: name the artifact"},
		{[]string{"sign", ref, "--oms", sig, "--key", pub}, "--key and --annotations do not apply"},
		{[]string{"sign", ref, "--oms", model}, "signs a local directory and takes no REF"},
	} {
		if code, _, errOut := run(c.args...); code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, want 2 with %q: %s", c.args, code, c.want, errOut)
		}
	}
}
