package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
	"golang.org/x/crypto/bcrypt"
)

// runRemoteCLI executes the CLI in-process with stdin and returns stdout; stderr goes to the test log.
func runRemoteCLI(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	root := NewRoot()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(args)
	err := root.Execute()
	if errb.Len() > 0 {
		t.Logf("modelpack %s: stderr:\n%s", strings.Join(args, " "), errb.String())
	}
	return out.String(), err
}

func mustRemoteCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, err := runRemoteCLI(t, "", args...)
	if err != nil {
		t.Fatalf("modelpack %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func TestRegistryCommands(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	model := t.TempDir()
	if err := testmodel.Generate(model, testmodel.Spec{Shards: 2, ShardSize: 64 << 10, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	ref := reg.Host + "/org/model:v1"
	mustRemoteCLI(t, "--home", home, "pack", model, "-t", ref, "-q")

	out := mustRemoteCLI(t, "--home", home, "push", "--plain-http", ref)
	if !strings.Contains(out, "Pushed "+ref) {
		t.Fatalf("push output: %s", out)
	}
	var res struct {
		Transferred int64 `json:"transferredBytes"`
		Blobs       []struct {
			Status string `json:"status"`
		} `json:"blobs"`
	}
	out = mustRemoteCLI(t, "--home", home, "push", "--plain-http", "-o", "json", ref)
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("push -o json: %v: %s", err, out)
	}
	if res.Transferred != 0 || len(res.Blobs) == 0 || res.Blobs[0].Status != "exists" {
		t.Fatalf("repeated push: %+v, want 0 bytes and every blob existing", res)
	}

	home2 := t.TempDir()
	mustRemoteCLI(t, "--home", home2, "pull", "--plain-http", "-q", ref)
	if out := mustRemoteCLI(t, "--home", home2, "list"); !strings.Contains(out, ref) {
		t.Fatalf("the pulled artifact is not listed: %s", out)
	}

	dir := t.TempDir()
	mustRemoteCLI(t, "fetch", "--plain-http", "-q", ref, dir, "--filter", "weights")
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("fetch --filter weights wrote %d entries, want 2 shards", len(entries))
	}
	want, _ := os.ReadFile(filepath.Join(model, testmodel.ShardName(0, 2)))
	if got, _ := os.ReadFile(filepath.Join(dir, testmodel.ShardName(0, 2))); !bytes.Equal(got, want) {
		t.Fatal("fetched shard differs")
	}

	out = mustRemoteCLI(t, "copy", "--plain-http", "-o", "json", ref, reg.Host+"/mirror/model")
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Transferred != 0 {
		t.Fatalf("copy within the registry: %s (%v), want mounts", out, err)
	}

	mustRemoteCLI(t, "pack", model, "-t", reg.Host+"/direct/model:v2", "--push", "--plain-http", "-q")
	dir2 := t.TempDir()
	mustRemoteCLI(t, "fetch", "--plain-http", "-q", reg.Host+"/direct/model:v2", dir2)
	if got, _ := os.ReadFile(filepath.Join(dir2, testmodel.ShardName(0, 2))); !bytes.Equal(got, want) {
		t.Fatal("shard after pack --push and fetch differs")
	}

	_, err := runRemoteCLI(t, "", "fetch", "--plain-http", reg.Host+"/org/model:nope", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), reg.Host+"/org/model") || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("fetch of a missing tag: %v", err)
	}
}

func TestLoginLogoutCommands(t *testing.T) {
	hash, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: "carol:" + string(hash) + "\n"})
	cfg := filepath.Join(t.TempDir(), "config.json")
	if _, err := runRemoteCLI(t, "wrong\n", "login", "--plain-http", "--registry-config", cfg, "-u", "carol", "--password-stdin", reg.Host); err == nil {
		t.Fatal("login with a wrong password succeeded")
	}
	out, err := runRemoteCLI(t, "pw\n", "login", "--plain-http", "--registry-config", cfg, "-u", "carol", "--password-stdin", reg.Host)
	if err != nil || !strings.Contains(out, "Login succeeded") {
		t.Fatalf("login: %v: %s", err, out)
	}
	model := t.TempDir()
	if err := testmodel.Generate(model, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	ref := reg.Host + "/auth/model:v1"
	mustRemoteCLI(t, "pack", model, "-t", ref, "--push", "--plain-http", "--registry-config", cfg, "-q")
	mustRemoteCLI(t, "logout", "--registry-config", cfg, reg.Host)
	_, err = runRemoteCLI(t, "", "fetch", "--plain-http", "--registry-config", cfg, ref, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "modelpack login "+reg.Host) {
		t.Fatalf("fetch after logout: %v, want a hint to log in", err)
	}
}

func TestPushAndPackPushSign(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	t.Setenv("COSIGN_PASSWORD", "test-password")
	keys := filepath.Join(t.TempDir(), "cosign")
	mustRemoteCLI(t, "key", "generate", "--output-key-prefix", keys)
	model := t.TempDir()
	if err := testmodel.Generate(model, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	ref := reg.Host + "/signed/model:v1"
	mustRemoteCLI(t, "--home", home, "pack", model, "-t", ref, "-q")
	out := mustRemoteCLI(t, "--home", home, "push", "--plain-http", "--sign", keys+".key", ref)
	if !strings.Contains(out, "Signed ") {
		t.Fatalf("push --sign output: %s", out)
	}
	mustRemoteCLI(t, "verify", "--plain-http", "--key", keys+".pub", "--insecure-ignore-tlog", ref)

	ref2 := reg.Host + "/signed/direct:v1"
	mustRemoteCLI(t, "pack", model, "-t", ref2, "--push", "--plain-http", "--sign", keys+".key", "-q")
	mustRemoteCLI(t, "verify", "--plain-http", "--key", keys+".pub", "--insecure-ignore-tlog", ref2)
	if _, err := runRemoteCLI(t, "", "verify", "--plain-http", "--key", keys+".pub", "--insecure-ignore-tlog", reg.Host+"/org/unsigned:v1"); err == nil {
		t.Fatal("verify of an unsigned artifact succeeded")
	}
}
