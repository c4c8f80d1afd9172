package cli

import (
	"encoding/base64"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testenv/hubserver"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// debugLines checks that stderr of a --debug run shows each of want (regular expressions, one per line) and none
// of the secrets.
func debugLines(t *testing.T, stderr string, want []string, secrets ...string) {
	t.Helper()
	for _, w := range want {
		if !regexp.MustCompile(`(?m)` + w).MatchString(stderr) {
			t.Errorf("--debug output lacks %s:\n%s", w, stderr)
		}
	}
	for _, s := range secrets {
		if strings.Contains(stderr, s) {
			t.Errorf("--debug output shows the secret %q:\n%s", s, stderr)
		}
	}
}

// Item 32.11: --debug prints a registry's requests and answers, the 401 and its challenge included, with the
// basic credentials redacted, from a push through htpasswd auth.
func TestDebugRegistryRequests(t *testing.T) {
	const user, password = "ann", "pw-D3bugS3cret"
	hash, _ := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: user + ":" + string(hash) + "\n"})
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir())
	home, src := t.TempDir(), filepath.Join(t.TempDir(), "m")
	if err := testmodel.Generate(src, testmodel.Spec{Shards: 1, ShardSize: 64 << 10, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	ref := reg.Host + "/a/model:v1"
	if code, _, stderr := run("--home", home, "pack", src, "-t", ref); code != 0 {
		t.Fatalf("pack: exit %d: %s", code, stderr)
	}
	code, _, stderr := run("--home", home, "--debug", "-q", "push", "--plain-http", "-u", user, "-p", password, ref)
	if code != 0 {
		t.Fatalf("push --debug: exit %d: %s", code, stderr)
	}
	h := regexp.QuoteMeta("http://" + reg.Host)
	debugLines(t, stderr, []string{
		`^\[debug #\d+\] > POST ` + h + `/v2/a/model/blobs/uploads/$`,
		`^\[debug #\d+\] > PUT ` + h + `/v2/a/model/manifests/v1$`,
		`^\[debug #\d+\] < HTTP/1\.1 401 Unauthorized \(headers after \S+\)$`,
		`^\[debug #\d+\] < Www-Authenticate: Basic realm="test"$`,
		`^\[debug #\d+\] > Authorization: Basic \*\*\*$`,
		`^\[debug #\d+\] < HTTP/1\.1 201 Created \(headers after \S+\)$`,
		`^\[debug #\d+\] < Docker-Content-Digest: sha256:[0-9a-f]{64}$`,
		`^\[debug #\d+\] < done in \S+$`, // a push's answers have no bodies
	}, password, base64.StdEncoding.EncodeToString([]byte(user+":"+password)))

	// Without --debug, nothing of it.
	code, _, stderr = run("--home", home, "-q", "pull", "--plain-http", "-u", user, "-p", password, ref)
	if code != 0 || strings.Contains(stderr, "[debug") {
		t.Fatalf("pull without --debug: exit %d: %q", code, stderr)
	}
}

// Item 32.11: --debug prints the Hub's requests and answers, the LFS redirect to the download host and the hop
// there included, with HF_TOKEN redacted.
func TestDebugHubRequests(t *testing.T) {
	repo, _ := hubRepo(t, "acme/gated")
	const token = "hf_D3bugT0kenSecret0123456789"
	repo.Token = token
	s := hubserver.Start(t, repo)
	hubEnv(t, s)
	t.Setenv("HF_TOKEN", token)
	run := binaryRunner(t)
	code, _, stderr := run("--home", t.TempDir(), "--debug", "-q", "pack", "hf://acme/gated", "-t", "gated:v1")
	if code != 0 {
		t.Fatalf("pack --debug: exit %d: %s", code, stderr)
	}
	debugLines(t, stderr, []string{
		`^\[debug #\d+\] > GET ` + regexp.QuoteMeta(s.URL) + `/api/models/acme/gated/revision/main\S*$`,
		`^\[debug #\d+\] > Authorization: Bearer \*\*\*$`,
		`^\[debug #\d+\] > GET ` + regexp.QuoteMeta(s.URL) + `/acme/gated/resolve/[0-9a-f]{40}/` + regexp.QuoteMeta(hubShard) + `$`,
		`^\[debug #\d+\] < HTTP/1\.1 302 Found \(headers after \S+\)$`,
		`^\[debug #\d+\] < Location: ` + regexp.QuoteMeta(s.DownloadURL) + `/\S+$`,
		`^\[debug #\d+\] > GET ` + regexp.QuoteMeta(s.DownloadURL) + `/\S+$`,
		`^\[debug #\d+\] < HTTP/1\.1 200 OK \(headers after \S+\)$`,
		`^\[debug #\d+\] < done in \S+, \d+ body bytes read$`,
	}, token)
}
