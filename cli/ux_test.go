package cli

import (
	"bytes"
	"context"
	"encoding/json"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
	"golang.org/x/crypto/bcrypt"
)

// runJSON runs the CLI through Run, as main does, and returns the exit code, stdout and stderr.
func runJSON(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

const modelArtifactType = "application/vnd.cncf.model.manifest.v1+json"

type descriptorJSON struct {
	Digest       string `json:"digest"`
	ArtifactType string `json:"artifactType"`
}

// Item: inspect reads a registry, tags lists a repository, and registry commands share one naming rule.
func TestInspectRemoteAndTags(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	model := smallModel(t)
	repo := reg.Host + "/org/tagged"
	for _, tag := range []string{"v1", "v2"} {
		mustRemoteCLI(t, "pack", model, "-t", repo+":"+tag, "--push", "--plain-http", "-q")
	}
	empty := t.TempDir() // a local store that does not hold it
	out := mustRemoteCLI(t, "--home", empty, "inspect", "--plain-http", repo+":v1")
	if !strings.Contains(out, "Reference:") || !strings.Contains(out, repo+":v1") || !strings.Contains(out, "config.json") || !strings.Contains(out, modelArtifactType) {
		t.Fatalf("inspect of a registry reference:\n%s", out)
	}
	var info struct {
		Reference  string         `json:"reference"`
		Descriptor descriptorJSON `json:"descriptor"`
		Config     json.RawMessage
	}
	if err := json.Unmarshal([]byte(mustRemoteCLI(t, "--home", empty, "inspect", "--remote", "--plain-http", repo+":v2", "-o", "json")), &info); err != nil || info.Descriptor.ArtifactType != modelArtifactType || len(info.Config) == 0 {
		t.Fatalf("inspect --remote -o json: %v %+v", err, info)
	}
	if out := mustRemoteCLI(t, "tags", "--plain-http", repo); out != "v1\nv2\n" {
		t.Fatalf("tags: %q", out)
	}
	var tags struct {
		Repository string   `json:"repository"`
		Tags       []string `json:"tags"`
	}
	if err := json.Unmarshal([]byte(mustRemoteCLI(t, "tags", "--plain-http", repo, "-o", "json")), &tags); err != nil || tags.Repository != repo || len(tags.Tags) != 2 {
		t.Fatalf("tags -o json: %v %+v", err, tags)
	}

	// No tag: a clear refusal naming the way out, not a silent :latest and "not found: not found".
	for _, cmd := range [][]string{{"fetch", "--plain-http", repo, t.TempDir()}, {"pull", "--plain-http", repo}, {"inspect", "--remote", "--plain-http", repo}} {
		_, err := runRemoteCLI(t, "", append([]string{"--home", empty}, cmd...)...)
		if err == nil || !strings.Contains(err.Error(), "has no tag or digest") || !strings.Contains(err.Error(), "modelpack tags "+repo) {
			t.Fatalf("%s without a tag: %v", cmd[0], err)
		}
	}
	_, err := runRemoteCLI(t, "", "fetch", "--plain-http", repo+":nope", t.TempDir())
	if err == nil || strings.Contains(err.Error(), "not found: not found") || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("fetch of a missing tag: %v", err)
	}
	// A bare name is a local-store name everywhere: verify and sign refuse it instead of asking docker.io.
	for _, cmd := range [][]string{{"verify", "llama3:8b", "--key", "k.pub", "--insecure-ignore-tlog"}, {"sign", "llama3:8b", "--key", "k.key"}, {"pull", "llama3:8b"}, {"tags", "llama3"}} {
		_, err := runRemoteCLI(t, "", cmd...)
		if err == nil || !strings.Contains(err.Error(), `"llama3`) || !strings.Contains(err.Error(), "names no registry") {
			t.Fatalf("%s of a bare name: %v", cmd[0], err)
		}
	}
	if _, err := runRemoteCLI(t, "", "--home", empty, "inspect", "llama3:8b"); err == nil || strings.Contains(err.Error(), "docker.io") {
		t.Fatalf("inspect of a bare name not in the store: %v", err)
	}
}

// Item: one JSON schema per object; errors as JSON; nothing on stderr under -o json.
func TestJSONOutputIsOneSchema(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	t.Setenv("COSIGN_PASSWORD", "pw")
	keys := filepath.Join(t.TempDir(), "cosign")
	mustRemoteCLI(t, "key", "generate", "--output-key-prefix", keys)
	model := smallModel(t)
	home := t.TempDir()
	ref := reg.Host + "/json/model:v1"
	mustRemoteCLI(t, "--home", home, "pack", model, "-t", "json/model:v1", "-q")

	type transfer struct {
		Reference  string         `json:"reference"`
		Descriptor descriptorJSON `json:"descriptor"`
		Blobs      []any          `json:"blobs"`
		Signature  *struct {
			Signed, Tag, Key string
		} `json:"signature"`
		Dir   string   `json:"dir"`
		Files []string `json:"files"`
	}
	decode := func(name, stdout, stderr string) transfer {
		t.Helper()
		if stderr != "" {
			t.Fatalf("%s -o json wrote to stderr: %q", name, stderr)
		}
		var v transfer
		if err := json.Unmarshal([]byte(stdout), &v); err != nil {
			t.Fatalf("%s -o json: %v: %s", name, err, stdout)
		}
		if v.Reference == "" || !strings.HasPrefix(v.Descriptor.Digest, "sha256:") || v.Descriptor.ArtifactType != modelArtifactType {
			t.Fatalf("%s -o json lacks reference or descriptor.artifactType: %s", name, stdout)
		}
		return v
	}
	run := func(args ...string) transfer {
		t.Helper()
		code, out, errOut := runJSON(t, append(args, "-o", "json")...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		return decode(args[0]+" "+args[1], out, errOut)
	}
	pushed := run("--home", home, "push", ref, "--from", "json/model:v1", "--plain-http", "--sign", keys+".key")
	if pushed.Signature == nil || pushed.Signature.Signed != reg.Host+"/json/model@"+pushed.Descriptor.Digest ||
		pushed.Signature.Tag != reg.Host+"/json/model:sha256-"+strings.TrimPrefix(pushed.Descriptor.Digest, "sha256:")+".sig" {
		t.Fatalf("push --sign -o json: signature %+v", pushed.Signature)
	}
	packed := run("pack", model, "-t", reg.Host+"/json/direct:v1", "--push", "--plain-http", "--sign", keys+".key")
	if packed.Signature == nil || len(packed.Blobs) == 0 {
		t.Fatalf("pack --push --sign -o json: %+v", packed)
	}
	run("--home", t.TempDir(), "pull", ref, "--plain-http")
	run("copy", ref, reg.Host+"/json/copy:v1", "--plain-http")
	fetched := run("fetch", ref, filepath.Join(t.TempDir(), "f"), "--plain-http")
	unpacked := run("--home", home, "unpack", "json/model:v1", filepath.Join(t.TempDir(), "u"))
	if len(fetched.Files) == 0 || strings.Join(fetched.Files, ",") != strings.Join(unpacked.Files, ",") || fetched.Dir == "" || unpacked.Dir == "" {
		t.Fatalf("fetch and unpack list different files: %v vs %v", fetched.Files, unpacked.Files)
	}
	code, out, errOut := runJSON(t, "sign", ref, "--key", keys+".key", "--plain-http", "-o", "json")
	var signed struct {
		Reference string `json:"reference"`
		Signature struct {
			Signed, Tag string
		} `json:"signature"`
	}
	if code != 0 || errOut != "" || json.Unmarshal([]byte(out), &signed) != nil || signed.Reference != ref || signed.Signature.Tag != pushed.Signature.Tag {
		t.Fatalf("sign -o json: %d %s %s", code, out, errOut)
	}
	code, out, _ = runJSON(t, "verify", ref, "--key", keys+".pub", "--insecure-ignore-tlog", "--plain-http", "-o", "json")
	var verified map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &verified) != nil || verified["reference"] != reg.Host+"/json/model@"+pushed.Descriptor.Digest || verified["ref"] != nil || verified["verified"] != true {
		t.Fatalf("verify -o json: %s", out)
	}

	// Errors: a JSON object on stderr, nothing on stdout, exit 1.
	code, out, errOut = runJSON(t, "fetch", reg.Host+"/json/model:nope", t.TempDir(), "--plain-http", "-o", "json")
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if code != 1 || out != "" || json.Unmarshal([]byte(errOut), &e) != nil || !strings.Contains(e.Error.Message, "not found") {
		t.Fatalf("error under -o json: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, _, errOut := runJSON(t, "fetch", reg.Host+"/json/model:nope", t.TempDir(), "--plain-http"); code != 1 || !strings.HasPrefix(errOut, "Error: ") {
		t.Fatalf("error as text: %d %q", code, errOut)
	}
}

// Item: copy between a TLS registry with its own CA and a plain-HTTP one, with --from-*/--to-* flags alone.
func TestCopyBetweenTLSAndPlainHTTP(t *testing.T) {
	caFile, certFile, keyFile := testenv.WriteCA(t)
	hash, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	tlsReg := testenv.StartRegistry(t, testenv.RegistryOptions{CertFile: certFile, KeyFile: keyFile, Htpasswd: "ann:" + string(hash) + "\n"})
	plain := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	model := smallModel(t)
	src := tlsReg.Host + "/org/model:v1"
	// -u/-p on a command that logs in, as oras takes them.
	mustRemoteCLI(t, "pack", model, "-t", src, "--push", "--ca-file", caFile, "-u", "ann", "-p", "pw", "-q")
	dst := plain.Host + "/copied/model:v1"
	if _, err := runRemoteCLI(t, "", "copy", src, dst, "--ca-file", caFile, "-u", "ann", "-p", "pw"); err == nil {
		t.Fatal("copy to a plain-HTTP registry over TLS succeeded")
	}
	mustRemoteCLI(t, "copy", src, dst, "--from-ca-file", caFile, "--to-plain-http", "-u", "ann", "-p", "pw", "-q")
	dir := t.TempDir()
	mustRemoteCLI(t, "fetch", "--plain-http", dst, dir, "-q")
	back := reg2(t, tlsReg.Host)
	if _, err := runRemoteCLI(t, "", "copy", dst, back, "--from-plain-http", "--to-ca-file", caFile); err == nil {
		t.Fatal("copy to a registry with basic auth succeeded with no credentials")
	}
	mustRemoteCLI(t, "copy", dst, back, "--from-plain-http", "--to-ca-file", caFile, "--to-username", "ann", "--to-password", "pw", "-q")
	mustRemoteCLI(t, "inspect", "--remote", back, "--ca-file", caFile, "-u", "ann", "-p", "pw")
}

func reg2(t *testing.T, host string) string { t.Helper(); return host + "/back/model:v1" }

// Item: a container image is named as one, and its root filesystem is written only with --image-rootfs.
func TestContainerImageNeedsImageRootfs(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	ref := reg.Host + "/img/busybox:v1"
	pushContainerImage(t, ref)
	dir := filepath.Join(t.TempDir(), "rootfs")
	_, err := runRemoteCLI(t, "", "fetch", "--plain-http", ref, dir)
	if err == nil || !strings.Contains(err.Error(), "is a container image") || !strings.Contains(err.Error(), "--image-rootfs") {
		t.Fatalf("fetch of an image: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatal("a refused fetch created the directory")
	}
	mustRemoteCLI(t, "fetch", "--plain-http", "--image-rootfs", "-q", ref, dir)
	if b, _ := os.ReadFile(filepath.Join(dir, "etc", "os-release")); string(b) != "ID=test\n" {
		t.Fatal("fetch --image-rootfs did not write the root filesystem")
	}
	home := t.TempDir()
	var out, errb bytes.Buffer
	root := NewRoot()
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs([]string{"--home", home, "pull", "--plain-http", ref})
	if err := root.Execute(); err != nil || !strings.Contains(errb.String(), "is a container image, not a model") {
		t.Fatalf("pull of an image: %v, stderr %q", err, errb.String())
	}
	if out := mustRemoteCLI(t, "--home", home, "inspect", ref); !strings.Contains(out, "container image") {
		t.Fatalf("inspect of an image:\n%s", out)
	}
	if _, err := runRemoteCLI(t, "", "--home", home, "unpack", ref, filepath.Join(t.TempDir(), "u")); err == nil || !strings.Contains(err.Error(), "--image-rootfs") {
		t.Fatalf("unpack of an image: %v", err)
	}
}

// pushContainerImage pushes to ref, with crane, a one-layer container image holding etc/os-release ("ID=test").
func pushContainerImage(t *testing.T, ref string) {
	t.Helper()
	layer := filepath.Join(t.TempDir(), "layer.tar")
	if err := os.WriteFile(layer, testmodel.Tar(t, "etc/os-release", "ID=test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(testenv.Tool(t, "crane"), "append", "--insecure", "--oci-empty-base", "-f", layer, "-t", ref).CombinedOutput(); err != nil {
		t.Fatalf("crane append: %v\n%s", err, out)
	}
}

// Item: a hosts.toml entry for the origin itself (containerd's way to give it a CA) is used for the origin, by
// push, fetch and login alike, with no --ca-file.
func TestHostsTomlCAForTheOrigin(t *testing.T) {
	caFile, certFile, keyFile := testenv.WriteCA(t)
	hash, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{CertFile: certFile, KeyFile: keyFile, Htpasswd: "ann:" + string(hash) + "\n"})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	hosts := t.TempDir()
	dir := filepath.Join(hosts, reg.Host)
	os.MkdirAll(dir, 0o755)
	ca, _ := os.ReadFile(caFile)
	os.WriteFile(filepath.Join(dir, "ca.pem"), ca, 0o644)
	toml := "server = \"https://" + reg.Host + "\"\n[host.\"https://" + reg.Host + "\"]\n  capabilities = [\"pull\", \"resolve\", \"push\"]\n  ca = \"ca.pem\"\n"
	os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(toml), 0o644)
	cfg := filepath.Join(t.TempDir(), "config.json")
	if out, err := runRemoteCLI(t, "pw", "login", reg.Host, "--hosts-dir", hosts, "--registry-config", cfg, "-u", "ann", "--password-stdin"); err != nil {
		t.Fatalf("login with the origin's CA from hosts.toml: %v %s", err, out)
	}
	model := smallModel(t)
	ref := reg.Host + "/hosts/model:v1"
	mustRemoteCLI(t, "pack", model, "-t", ref, "--push", "--hosts-dir", hosts, "--registry-config", cfg, "-q")
	mustRemoteCLI(t, "fetch", ref, t.TempDir(), "--hosts-dir", hosts, "--registry-config", cfg, "-q")
	// A wrong password: the message says so and suggests nothing already done.
	_, err := runRemoteCLI(t, "nope", "login", reg.Host, "--hosts-dir", hosts, "--registry-config", cfg, "-u", "ann", "--password-stdin")
	if err == nil || !strings.Contains(err.Error(), `rejected user "ann"`) || strings.Contains(err.Error(), "modelpack login") {
		t.Fatalf("login with a wrong password: %v", err)
	}
}

// smallModel generates testmodel.Small in a temporary directory.
func smallModel(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := testmodel.Generate(dir, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Item: pack --push prints what push prints, and a weight.config layer is not labelled "(config)".
func TestPackPushSummary(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	ref := reg.Host + "/summary/model:v1"
	out := mustRemoteCLI(t, "pack", smallModel(t), "-t", ref, "--push", "--plain-http")
	if !strings.Contains(out, "Pushed "+ref) || !strings.Contains(out, "Digest: sha256:") || !strings.Contains(out, "Blobs: ") {
		t.Fatalf("pack --push summary:\n%s", out)
	}
	layer := ocispec.Descriptor{MediaType: "application/vnd.cncf.model.weight.config.v1.raw", Digest: digest.Digest("sha256:" + strings.Repeat("a", 64))}
	config := ocispec.Descriptor{MediaType: "application/vnd.cncf.model.config.v1+json", Digest: digest.Digest("sha256:" + strings.Repeat("b", 64))}
	if strings.Contains(blobLabel(layer), "(config)") || !strings.Contains(blobLabel(config), "(config)") {
		t.Fatalf("labels: layer %q, config %q", blobLabel(layer), blobLabel(config))
	}
}
