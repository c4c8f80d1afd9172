package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Item: verify resolves a tag as the node driver does (hosts.toml mirrors allowed to resolve, then the origin, no API
// ping first) and reads the signature the same way, so with an origin that accepts TCP and never answers and a
// mirror holding the model and its signature, the built binary verifies the tag and the origin receives nothing.
func TestVerifyNeverWaitsOnAHungOrigin(t *testing.T) {
	mirror := testenv.StartRegistry(t, testenv.RegistryOptions{})
	hung := testenv.StartHungServer(t)
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir(), "MODELPACK_HOME="+t.TempDir(), "COSIGN_PASSWORD=pw")
	keys := filepath.Join(t.TempDir(), "cosign")
	if code, _, errOut := run("key", "generate", "--output-key-prefix", keys); code != 0 {
		t.Fatalf("key generate: %s", errOut)
	}
	// The mirror holds what the origin would: the model under the same repository and tag, signed.
	code, out, errOut := run("pack", smallModel(t), "-t", mirror.Host+"/hung/model:v1", "--push", "--plain-http", "--sign", keys+".key", "-o", "json")
	if code != 0 {
		t.Fatalf("pack --push --sign to the mirror: %s", errOut)
	}
	pushed := decodeOne(t, "pack --push", out)
	dgst := pushed["descriptor"].(map[string]any)["digest"].(string)

	hosts := t.TempDir()
	os.MkdirAll(filepath.Join(hosts, hung.Host), 0o755)
	toml := "[host.\"http://" + mirror.Host + "\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
	if err := os.WriteFile(filepath.Join(hosts, hung.Host, "hosts.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	ref := hung.Host + "/hung/model:v1"
	code, out, errOut = run("verify", ref, "--key", keys+".pub", "--insecure-ignore-tlog", "--plain-http", "--hosts-dir", hosts, "-o", "json")
	if code != 0 || errOut != "" {
		t.Fatalf("verify through the mirror, origin hung: exit %d, stderr %s", code, errOut)
	}
	doc := decodeOne(t, "verify", out)
	if want := hung.Host + "/hung/model@" + dgst; doc["reference"] != want || doc["verified"] != true {
		t.Fatalf("verify -o json: %v; want %s verified", doc, want)
	}
	if n, b := hung.Accepted(), hung.BytesRead(); n != 0 || b != 0 {
		t.Fatalf("the hung origin received %d connection(s), %d byte(s); want none", n, b)
	}

	// A digest reference needs no resolving: checked through the mirror too, the origin still untouched.
	code, out, errOut = run("verify", hung.Host+"/hung/model@"+dgst, "--key", keys+".pub", "--insecure-ignore-tlog", "--plain-http", "--hosts-dir", hosts, "-o", "json")
	if code != 0 || decodeOne(t, "verify by digest", out)["verified"] != true {
		t.Fatalf("verify by digest: exit %d, %s %s", code, out, errOut)
	}
	if n := hung.Accepted(); n != 0 {
		t.Fatalf("the hung origin received %d connection(s) for a digest reference; want none", n)
	}
	if strings.Contains(out, mirror.Host) {
		t.Fatalf("verify names the mirror, not the reference asked for: %s", out)
	}

	// The sibling reads behave alike: inspect of the registry reference, and copy from it (to the mirror's host,
	// which is no mirror of itself), read through the mirror alone. (tags lists the origin's tags, and sign writes
	// to the origin: both must reach it.)
	for _, args := range [][]string{
		{"inspect", "--remote", ref},
		{"copy", ref, mirror.Host + "/hung/copied:v1"},
	} {
		code, out, errOut := run(append(args, "--plain-http", "--hosts-dir", hosts, "-o", "json")...)
		if code != 0 || errOut != "" {
			t.Fatalf("%s through the mirror, origin hung: exit %d, stderr %s", args[0], code, errOut)
		}
		if got := decodeOne(t, args[0], out)["descriptor"].(map[string]any)["digest"]; got != dgst {
			t.Fatalf("%s -o json: digest %v, want %s", args[0], got, dgst)
		}
	}
	if n := hung.Accepted(); n != 0 {
		t.Fatalf("the hung origin received %d connection(s) from inspect and copy; want none", n)
	}
}
