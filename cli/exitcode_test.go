package cli

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Item: a command line modelpack cannot run exits 2, as POSIX tools do, before any work; a run that fails exits 1.
func TestExitCodes(t *testing.T) {
	home := t.TempDir()
	run := binaryRunner(t, "MODELPACK_HOME="+home)
	model := t.TempDir()
	if err := os.WriteFile(filepath.Join(model, "w.safetensors"), []byte("weights"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		args []string
		code int
		want string
	}{
		"unknown flag":       {[]string{"ls", "--nope"}, 2, "unknown flag: --nope"},
		"unknown command":    {[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		"missing argument":   {[]string{"inspect"}, 2, "accepts 1 arg(s), received 0"},
		"extra argument":     {[]string{"version", "x"}, 2, `unknown command "x"`},
		"bad flag value":     {[]string{"ls", "-o", "yaml"}, 2, `invalid --output "yaml"`},
		"bad int value":      {[]string{"pack", model, "-t", "m:v1", "--concurrency", "many"}, 2, `invalid argument "many"`},
		"required flag":      {[]string{"pack", model}, 2, `required flag(s) "tag" not set`},
		"bad filter":         {[]string{"unpack", "m:v1", t.TempDir(), "--filter", "models"}, 2, `unknown kind "models"`},
		"bad kind rule":      {[]string{"pack", model, "-t", "m:v1", "--kind", "models=*"}, 2, `neither "*" nor "models" is a kind`},
		"bad tag":            {[]string{"pack", model, "-t", "Not/Valid"}, 2, `invalid reference "Not/Valid"`},
		"exclusive flags":    {[]string{"verify", "r.example/m:v1", "--certificate-identity", "a", "--certificate-identity-regexp", "b"}, 2, "none of the others can be"},
		"credentials in ref": {[]string{"pull", "user:pw@r.example/m:v1"}, 2, "may not carry credentials"},
		"not in the store":   {[]string{"inspect", "m:v9"}, 1, "m:v9: not found"},
		"no such directory":  {[]string{"pack", model + "-nope", "-t", "m:v1"}, 1, "no such directory"},
		"json usage error":   {[]string{"ls", "--nope", "-o", "json"}, 2, `"message": "unknown flag: --nope"`},
		"json runtime error": {[]string{"inspect", "m:v9", "-o", "json"}, 1, "not found"},
	} {
		code, _, stderr := run(tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%s: modelpack %s: exit %d, stderr %q; want exit %d and %q", name, strings.Join(tc.args, " "), code, stderr, tc.code, tc.want)
		}
	}
}

// Item: hf://Qwen names an organisation, not a model: a usage error, before any request reaches the Hub.
func TestHFReferenceWithoutRepositoryIsUsageError(t *testing.T) {
	var requests atomic.Int64
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		requests.Add(1)
		http.NotFound(w, nil)
	}))
	defer hub.Close()
	run := binaryRunner(t, "MODELPACK_HOME="+t.TempDir(), "HF_ENDPOINT="+hub.URL, "HF_HUB_OFFLINE=")
	for _, ref := range []string{"hf://Qwen", "hf://openai-community", "hf://Qwen@main"} {
		code, _, stderr := run("pack", ref, "-t", "qwen:v1")
		if code != 2 || !strings.Contains(stderr, "no repository") || !strings.Contains(stderr, "hf://ORG/NAME") {
			t.Errorf("pack %s: exit %d, stderr %q", ref, code, stderr)
		}
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("the Hub got %d requests", n)
	}
}

// Item: a registry on a loopback host (localhost, 127.0.0.0/8, [::1]) needs no --plain-http, as with docker and
// containerd; naming TLS for it (--ca-file, --insecure) talks HTTPS again.
func TestLoopbackRegistryIsPlainHTTP(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	_, port, _ := net.SplitHostPort(reg.Host)
	run := binaryRunner(t, "MODELPACK_HOME="+t.TempDir(), "DOCKER_CONFIG="+t.TempDir())
	model := smallModel(t)
	if code, _, stderr := run("pack", model, "-t", "127.0.0.1:"+port+"/org/m:v1", "--push", "-q"); code != 0 {
		t.Fatalf("pack --push to 127.0.0.1 without --plain-http: exit %d: %s", code, stderr)
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port} {
		if code, out, stderr := run("tags", host+"/org/m"); code != 0 || !strings.Contains(out, "v1") {
			t.Errorf("tags %s/org/m without --plain-http: exit %d %q %s", host, code, out, stderr)
		}
		if code, _, stderr := run("pull", host+"/org/m:v1", "-q"); code != 0 {
			t.Errorf("pull %s/org/m:v1 without --plain-http: exit %d %s", host, code, stderr)
		}
	}
	if code, _, stderr := run("tags", "127.0.0.1:"+port+"/org/m", "--insecure"); code != 1 || !strings.Contains(stderr, "plain HTTP") {
		t.Errorf("tags with --insecure (HTTPS) against a plain-HTTP loopback registry: exit %d %s", code, stderr)
	}
}

// Item: unpack of a registry reference the local store does not hold says so, and how to read it from the
// registry, without a request to it.
func TestUnpackRegistryRefNotInStore(t *testing.T) {
	home := t.TempDir()
	run := binaryRunner(t, "MODELPACK_HOME="+home)
	ref := "registry.example.com/org/model:v1"
	dst := filepath.Join(t.TempDir(), "out")
	code, _, stderr := run("unpack", ref, dst)
	for _, want := range []string{ref + " is not in the local store", "modelpack pull " + ref, "modelpack fetch " + ref + " " + dst} {
		if code != 1 || !strings.Contains(stderr, want) {
			t.Errorf("unpack %s: exit %d, stderr %q; want %q", ref, code, stderr, want)
		}
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("unpack that failed left %s: %v", dst, err)
	}
}

// Item: verify with flags and no --policy speaks of what the user gave ("the key given with --key (b.pub)"), not
// of a policy rule named "command line".
func TestVerifyNamesTheKeyGiven(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	run := binaryRunner(t, "MODELPACK_HOME="+t.TempDir(), "DOCKER_CONFIG="+t.TempDir(), "COSIGN_PASSWORD=pw")
	dir := t.TempDir()
	signer, other := filepath.Join(dir, "signer"), filepath.Join(dir, "other")
	for _, k := range []string{signer, other} {
		if code, _, stderr := run("key", "generate", "--output-key-prefix", k); code != 0 {
			t.Fatalf("key generate: %s", stderr)
		}
	}
	ref := reg.Host + "/signed/model:v1"
	if code, _, stderr := run("pack", smallModel(t), "-t", ref, "--push", "--sign", signer+".key", "-q"); code != 0 {
		t.Fatalf("pack --push --sign: %s", stderr)
	}
	code, _, stderr := run("verify", ref, "--key", other+".pub", "--insecure-ignore-tlog")
	if code != 1 || !strings.Contains(stderr, "is not verified by the key given with --key ("+other+".pub)") ||
		strings.Contains(stderr, "command line") || strings.Contains(stderr, "policy") {
		t.Errorf("verify with the wrong key: exit %d, stderr %q", code, stderr)
	}
	code, out, stderr := run("verify", ref, "--key", signer+".pub", "--insecure-ignore-tlog")
	if code != 0 || !strings.Contains(out, "(the key given with --key ("+signer+".pub))") || strings.Contains(out, "command line") {
		t.Errorf("verify with the signer's key: exit %d, %q %q", code, out, stderr)
	}
}

// Item: a bare tag that oras --oci-layout wrote ("8b") is that tag to every command, never "8b:latest".
func TestOrasLayoutBareTag(t *testing.T) {
	oras := testenv.Tool(t, "oras")
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	home, work := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "f.txt"), []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	push := exec.Command(oras, "push", "--oci-layout", home+":8b", "f.txt")
	push.Dir = work
	if out, err := push.CombinedOutput(); err != nil {
		t.Fatalf("oras push --oci-layout: %v\n%s", err, out)
	}
	run := binaryRunner(t, "MODELPACK_HOME="+home, "DOCKER_CONFIG="+t.TempDir())
	if code, out, stderr := run("inspect", "8b"); code != 0 || !strings.Contains(out, "Reference:      8b\n") {
		t.Errorf("inspect 8b: exit %d %q %s", code, out, stderr)
	}
	if code, _, stderr := run("push", reg.Host+"/org/f:v1", "--from", "8b", "-q"); code != 0 {
		t.Errorf("push --from 8b: exit %d %s", code, stderr)
	}
	if code, out, stderr := run("rm", "8b"); code != 0 || out != "removed 8b\n" {
		t.Errorf("rm 8b: exit %d %q %s", code, out, stderr)
	}
	if code, out, _ := run("ls", "-o", "json"); code != 0 || strings.Contains(out, `"8b`) {
		t.Errorf("ls after rm 8b: %s", out)
	}
}

// Item: cache ls on a live node, whose cache the running driver holds, says so and names the command that lists
// it through the driver, and that command does.
func TestCacheLsOnLiveNode(t *testing.T) {
	root, sockDir := t.TempDir(), t.TempDir()
	sock := filepath.Join(sockDir, "csi.sock")
	drv := exec.Command(testenv.Modelpack(t), "csi-driver", "--endpoint", "unix://"+sock, "--node-id", "n1", "--root", root,
		"--metrics-addr", "", "--registry-config", testenv.EmptyDockerConfig(t))
	var log strings.Builder
	drv.Stdout, drv.Stderr = &log, &log
	if err := drv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drv.Process.Kill(); _ = drv.Wait() })
	prepullSock := filepath.Join(sockDir, "prepull.sock")
	// The driver listens on its sockets once its cache is open: wait for that, not for a time.
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := os.Stat(prepullSock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the driver made no %s:\n%s", prepullSock, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	run := binaryRunner(t)
	for _, r := range []string{root, filepath.Join(root, "cache")} {
		code, _, stderr := run("cache", "ls", "--root", r, "--lock-timeout", "200ms")
		if code != 1 || !strings.Contains(stderr, "is held by another process") || !strings.Contains(stderr, "the CSI driver") ||
			!strings.Contains(stderr, "modelpack prepull cache --socket") {
			t.Errorf("cache ls --root %s on a live node: exit %d, stderr %q", r, code, stderr)
		}
	}
	for _, args := range [][]string{{"prepull", "cache", "--socket", prepullSock}, {"cache", "ls", "--socket", prepullSock}} {
		if code, out, stderr := run(args...); code != 0 || !strings.Contains(out, "DIGEST") || !strings.Contains(out, "HELD BY") {
			t.Errorf("%s: exit %d %q %s", strings.Join(args, " "), code, out, stderr)
		}
	}
	if code, out, stderr := run("cache", "ls", "--socket", prepullSock, "-o", "json"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("cache ls --socket -o json on an empty cache: exit %d %q %s", code, out, stderr)
	}
}
