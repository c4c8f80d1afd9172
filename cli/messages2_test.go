package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Item: `tags` of a repository the registry does not know says so in one line, without the registry's detail dump.
func TestTagsOfMissingRepositoryOneLine(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir())
	code, _, stderr := run("tags", "--plain-http", reg.Host+"/nope/model")
	want := "Error: repository " + reg.Host + "/nope/model not found\n"
	if code == 0 || stderr != want {
		t.Fatalf("exit %d, stderr %q, want %q", code, stderr, want)
	}
}

// Item: credentials given with -u/-p that the registry rejects are named as such; suggesting `modelpack login`
// would not help, since -u/-p take its place. Without -u/-p the login hint stays.
func TestRejectedExplicitCredentialsNoLoginHint(t *testing.T) {
	hash, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: "ann:" + string(hash) + "\n"})
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir())
	code, _, stderr := run("tags", "--plain-http", "-u", "ann", "-p", "wrong", reg.Host+"/a/model")
	if code == 0 || strings.Contains(stderr, "modelpack login") || !strings.Contains(stderr, "check -u/--username and -p/--password") {
		t.Fatalf("wrong -u/-p: exit %d: %s", code, stderr)
	}
	code, _, stderr = run("copy", "--plain-http", "--from-username", "ann", "--from-password", "wrong", reg.Host+"/a/model:v1", reg.Host+"/b/model:v1")
	if code == 0 || strings.Contains(stderr, "modelpack login") || !strings.Contains(stderr, "check --from-username and --from-password") {
		t.Fatalf("wrong --from-username/--from-password: exit %d: %s", code, stderr)
	}
	code, _, stderr = run("tags", "--plain-http", reg.Host+"/a/model")
	if code == 0 || !strings.Contains(stderr, "modelpack login "+reg.Host) {
		t.Fatalf("no credentials: exit %d: %s", code, stderr)
	}
}

// Item: packing a single file says how to pack it instead of a bare "not a directory".
func TestPackSingleFileSaysHow(t *testing.T) {
	run := binaryRunner(t)
	f := filepath.Join(t.TempDir(), "model.gguf")
	if err := os.WriteFile(f, []byte("GGUF\x03\x00\x00\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := run("--home", t.TempDir(), "pack", f, "-t", "m:v1")
	if code == 0 || !strings.Contains(stderr, "a file, not a model directory") || !strings.Contains(stderr, "ln "+f+" model/model.gguf && modelpack pack model") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
}
