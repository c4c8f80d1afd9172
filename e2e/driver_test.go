package e2e

// End-to-end tests of `modelpack csi-driver`: the test plays kubelet over the driver's unix socket, the driver
// runs as a child process with its real cache, and models come from a real distribution registry.

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// drvHtpasswd lets user e2e in with password e2e-secret (bcrypt).
const drvHtpasswd = "e2e:$2a$04$0VolbSl0.TW28FM1h47Wo.UonH/J9lu5n1xtU0R4LC0jPGN6wfZJC\n"

func drvSmallModel(tag string) drvModel {
	return drvModel{
		"model.safetensors": []byte("weights of " + tag),
		"config.json":       []byte(`{"tag":"` + tag + `"}`),
		"README.md":         []byte("# model " + tag),
	}
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDriverInlineStaticAndDynamicVolumes(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	testmodel.Push(t, reg.Host, "models/tiny", "v1", drvSmallModel("v1"), nil)
	d := drvStart(t, filepath.Join(dir, "node"), reg.Host)
	node := d.node()
	ref := reg.Host + "/models/tiny:v1"

	// Inline (ephemeral) volume, as kubelet sends it with podInfoOnMount.
	inline := drvKubelet(t, dir, "pod-a")
	req := testenv.PublishRequest("csi-inline-1", inline, map[string]string{
		"reference":                              ref,
		"csi.storage.k8s.io/ephemeral":           "true",
		"csi.storage.k8s.io/pod.name":            "pod-a",
		"csi.storage.k8s.io/pod.namespace":       "default",
		"csi.storage.k8s.io/pod.uid":             "uid-a",
		"csi.storage.k8s.io/serviceAccount.name": "default",
	})
	err := drvPublish(node, req, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got := drvRead(t, filepath.Join(inline, "model.safetensors")); got != "weights of v1" {
		t.Fatalf("weights: %q", got)
	}
	opts := drvMountOptions(t, inline)
	for _, o := range []string{"ro", "nosuid", "nodev"} {
		if !strings.Contains(","+opts+",", ","+o+",") {
			t.Errorf("mount options %q lack %s", opts, o)
		}
	}
	err = os.WriteFile(filepath.Join(inline, "new"), []byte("x"), 0o644)
	if !errors.Is(err, syscall.EROFS) {
		t.Fatalf("create in the volume: %v, want EROFS", err)
	}
	if err := os.WriteFile(filepath.Join(inline, "model.safetensors"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("overwrite in the volume: %v, want EROFS", err)
	}
	// kubelet retries are idempotent; the same target with other arguments conflicts.
	if err := drvPublish(node, req, time.Minute); err != nil {
		t.Fatalf("republish: %v", err)
	}
	other := testenv.PublishRequest("csi-inline-1", inline, map[string]string{"reference": ref, "filter": "docs"})
	drvWantCode(t, drvPublish(node, other, time.Minute), codes.AlreadyExists, "other arguments")

	// Static PV: the PV's volumeAttributes, a partial view (configs only) and noexec.
	static := drvKubelet(t, dir, "pod-b")
	pv := testenv.PublishRequest("pv-tiny", static, map[string]string{"reference": ref, "filter": "config", "noexec": "true"})
	if err := drvPublish(node, pv, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := drvRead(t, filepath.Join(static, "config.json")); got != `{"tag":"v1"}` {
		t.Fatalf("config: %q", got)
	}
	if _, err := os.Stat(filepath.Join(static, "model.safetensors")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("filter=config shows the weights: %v", err)
	}
	if o := drvMountOptions(t, static); !strings.Contains(","+o+",", ",noexec,") {
		t.Fatalf("noexec missing from %q", o)
	}
	if n := d.metric("modelpack_csi_volumes"); n != 2 {
		t.Fatalf("volumes metric %v, want 2", n)
	}

	// Dynamic provisioning: the StorageClass parameters become the PV's volume context.
	ctrl := csi.NewControllerClient(d.conn())
	mkReq := func(params map[string]string) *csi.CreateVolumeRequest {
		return &csi.CreateVolumeRequest{Name: "pvc-1234", Parameters: params, VolumeCapabilities: []*csi.VolumeCapability{
			testenv.PublishRequest("", "", nil).VolumeCapability}}
	}
	_, err = ctrl.CreateVolume(context.Background(), mkReq(map[string]string{"reference": ref, "filter": "video"}))
	drvWantCode(t, err, codes.InvalidArgument, "valid keys")
	created, err := ctrl.CreateVolume(context.Background(), mkReq(map[string]string{
		"reference": ref, "filter": "docs", "csi.storage.k8s.io/pvc/name": "models", "csi.storage.k8s.io/pvc/namespace": "default"}))
	if err != nil {
		t.Fatal(err)
	}
	dynamic := drvKubelet(t, dir, "pod-c")
	if err := drvPublish(node, testenv.PublishRequest(created.Volume.VolumeId, dynamic, created.Volume.VolumeContext), time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := drvRead(t, filepath.Join(dynamic, "README.md")); got != "# model v1" {
		t.Fatalf("docs view: %q", got)
	}
	drvUnpublish(t, node, created.Volume.VolumeId, dynamic)
	if _, err := ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: created.Volume.VolumeId}); err != nil {
		t.Fatal(err)
	}

	drvUnpublish(t, node, "csi-inline-1", inline)
	drvUnpublish(t, node, "pv-tiny", static)
	// Unpublishing again (a kubelet retry) is fine.
	drvUnpublish(t, node, "pv-tiny", static)
	if n := d.metric("modelpack_csi_volumes"); n != 0 {
		t.Fatalf("volumes metric %v after unpublish, want 0", n)
	}
}

func TestDriverPullPolicyMatrix(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	proxy := drvStartProxy(t, reg.Host)
	d := drvStart(t, filepath.Join(dir, "node"), proxy.Host)
	node := d.node()
	repo := proxy.Host + "/models/policy"
	pod := 0
	// publish mounts ref with policy in a new pod and returns what the weights file says.
	publish := func(ref, policy string) (string, error) {
		pod++
		target := drvKubelet(t, dir, fmt.Sprint("pod-", pod))
		attrs := map[string]string{"reference": ref}
		if policy != "" {
			attrs["pullPolicy"] = policy
		}
		if err := drvPublish(node, testenv.PublishRequest(fmt.Sprint("vol-", pod), target, attrs), time.Minute); err != nil {
			return "", err
		}
		defer drvUnpublish(t, node, fmt.Sprint("vol-", pod), target)
		return drvRead(t, filepath.Join(target, "model.safetensors")), nil
	}
	must := func(ref, policy, want string) {
		t.Helper()
		got, err := publish(ref, policy)
		if err != nil {
			t.Fatalf("%s with %q: %v", ref, policy, err)
		}
		if got != "weights of "+want {
			t.Fatalf("%s with %q mounted %q, want the %s content", ref, policy, got, want)
		}
	}

	first := testmodel.Push(t, reg.Host, "models/policy", "v1", drvSmallModel("one"), nil)
	_, err := publish(repo+":v1", "Never")
	drvWantCode(t, err, codes.FailedPrecondition, "Never")

	must(repo+":v1", "IfNotPresent", "one")
	// The tag moves in the registry.
	testmodel.Push(t, reg.Host, "models/policy", "v1", drvSmallModel("two"), nil)
	before := proxy.manifestRequests()
	must(repo+":v1", "IfNotPresent", "one")
	must(repo+":v1", "Never", "one")
	must(repo+":v1", "", "one") // a tag other than latest defaults to IfNotPresent
	if n := proxy.manifestRequests(); n != before {
		t.Fatalf("IfNotPresent/Never with the content present asked the registry (%d manifest requests)", n-before)
	}
	must(repo+":v1", "Always", "two")
	must(repo+":v1", "IfNotPresent", "two") // the node's copy of the tag is now the new one
	must(repo+"@"+first.String(), "Never", "one")

	// :latest and no tag default to Always: each publish sees the tag's current content.
	testmodel.Push(t, reg.Host, "models/policy", "latest", drvSmallModel("three"), nil)
	must(repo+":latest", "", "three")
	testmodel.Push(t, reg.Host, "models/policy", "latest", drvSmallModel("four"), nil)
	must(repo+":latest", "", "four")
	must(repo, "", "four")

	// Always fails when the registry cannot be asked, even with content on the node; IfNotPresent does not.
	reg.Stop()
	_, err = publish(repo+":v1", "Always")
	drvWantCode(t, err, codes.Unavailable, "")
	must(repo+":v1", "IfNotPresent", "two")
}

func TestDriverConcurrentPodsShareOneDownloadAndView(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	proxy := drvStartProxy(t, reg.Host)
	weights := randomBytes(t, 4<<20)
	model := drvSmallModel("shared")
	model["model.safetensors"] = weights
	testmodel.Push(t, reg.Host, "models/shared", "v1", model, nil)
	d := drvStart(t, filepath.Join(dir, "node"), proxy.Host)
	node := d.node()
	ref := proxy.Host + "/models/shared:v1"

	const pods = 20
	targets := make([]string, pods)
	errs := make([]error, pods)
	var wg sync.WaitGroup
	for i := range pods {
		targets[i] = drvKubelet(t, dir, fmt.Sprint("pod-", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = drvPublish(node, testenv.PublishRequest(fmt.Sprint("vol-", i), targets[i], map[string]string{"reference": ref}), time.Minute)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
	}
	for name, b := range model {
		dg := digestOf(b)
		if n := proxy.blobGetsOf(dg); n != 1 {
			t.Errorf("%s downloaded %d times, want once", name, n)
		}
	}
	if n := d.metric("modelpack_csi_pulls_total", `result="ok"`); n != 1 {
		t.Errorf("%v pulls, want 1", n)
	}
	if n := d.metric("modelpack_csi_views"); n != 1 {
		t.Errorf("%v views, want 1 shared by all pods", n)
	}
	first, err := os.Stat(filepath.Join(targets[0], "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range targets[1:] {
		fi, err := os.Stat(filepath.Join(tg, "model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		if !os.SameFile(first, fi) {
			t.Fatalf("%s shows another copy of the weights than %s", tg, targets[0])
		}
	}
	if got, _ := os.ReadFile(filepath.Join(targets[pods-1], "model.safetensors")); !bytes.Equal(got, weights) {
		t.Fatal("weights differ from what was pushed")
	}
	for i, tg := range targets {
		drvUnpublish(t, node, fmt.Sprint("vol-", i), tg)
	}
	if n := d.metric("modelpack_csi_view_refs"); n != 0 {
		t.Errorf("%v holds on views after every pod left, want 0", n)
	}
}

func TestDriverSlowRegistryAbortsThenJoins(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	proxy := drvStartProxy(t, reg.Host)
	weights := randomBytes(t, 8<<20)
	model := drvModel{"model.safetensors": weights, "config.json": []byte("{}")}
	testmodel.Push(t, reg.Host, "models/slow", "v1", model, nil)
	d := drvStart(t, filepath.Join(dir, "node"), proxy.Host)
	node := d.node()
	proxy.rate.Store(1 << 20) // 1 MiB/s: about 8 s for the weights

	target := drvKubelet(t, dir, "pod-slow")
	req := testenv.PublishRequest("vol-slow", target, map[string]string{"reference": proxy.Host + "/models/slow:v1"})
	start := time.Now()
	const deadline = 2 * time.Second
	err := drvPublish(node, req, deadline)
	drvWantCode(t, err, codes.Aborted, "in progress")
	if el := time.Since(start); el > deadline {
		t.Fatalf("ABORTED arrived after the deadline (%v)", el)
	}
	t.Logf("first answer: %s", status.Convert(err).Message())
	aborted := 1
	for {
		err := drvPublish(node, req, deadline)
		if err == nil {
			break
		}
		drvWantCode(t, err, codes.Aborted, "")
		aborted++
		if time.Since(start) > time.Minute {
			t.Fatal("pull did not finish within a minute")
		}
	}
	t.Logf("mounted after %d ABORTED answers in %v", aborted, time.Since(start).Round(time.Millisecond))
	if aborted < 2 {
		t.Fatalf("only %d ABORTED answers: the throttle did not slow the pull", aborted)
	}
	if n := proxy.blobGetsOf(digestOf(weights)); n != 1 {
		t.Fatalf("weights requested %d times: retries restarted the download", n)
	}
	if got, _ := os.ReadFile(filepath.Join(target, "model.safetensors")); !bytes.Equal(got, weights) {
		t.Fatal("weights differ from what was pushed")
	}
	if n := d.metric("modelpack_csi_pulls_total"); n != 1 {
		t.Fatalf("%v pulls, want 1", n)
	}
	drvUnpublish(t, node, "vol-slow", target)
}

func TestDriverSIGKILLRecovery(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	proxy := drvStartProxy(t, reg.Host)
	testmodel.Push(t, reg.Host, "models/small", "v1", drvSmallModel("small"), nil)
	weights := randomBytes(t, 8<<20)
	testmodel.Push(t, reg.Host, "models/big", "v1", drvModel{"model.safetensors": weights}, nil)
	d := drvStart(t, filepath.Join(dir, "node"), proxy.Host)
	node := d.node()

	kept := drvKubelet(t, dir, "pod-kept")
	vanished := drvKubelet(t, dir, "pod-vanished")
	for i, tg := range []string{kept, vanished} {
		if err := drvPublish(node, testenv.PublishRequest(fmt.Sprint("vol-", i), tg, map[string]string{"reference": proxy.Host + "/models/small:v1"}), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	proxy.rate.Store(2 << 20)
	big := drvKubelet(t, dir, "pod-big")
	bigReq := testenv.PublishRequest("vol-big", big, map[string]string{"reference": proxy.Host + "/models/big:v1"})
	drvWantCode(t, drvPublish(node, bigReq, 2*time.Second), codes.Aborted, "in progress")

	d.kill()
	// The kernel keeps the bind mounts: the running pod still reads its model.
	if got := drvRead(t, filepath.Join(kept, "model.safetensors")); got != "weights of small" {
		t.Fatalf("volume unreadable while the driver is down: %q", got)
	}
	// While the driver is down the node reboots the other pod away: its mount and pod directory are gone.
	if err := syscall.Unmount(vanished, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "kubelet", "pods", "pod-vanished")); err != nil {
		t.Fatal(err)
	}

	proxy.rate.Store(8 << 20)
	d.restart()
	node = d.node()
	if n := d.metric("modelpack_csi_volumes_collected_total", `reason="pod_gone"`); n != 1 {
		t.Errorf("%v volumes collected for vanished pods, want 1", n)
	}
	if got := drvRead(t, filepath.Join(kept, "model.safetensors")); got != "weights of small" {
		t.Fatalf("volume unreadable after restart: %q", got)
	}
	drvUnpublish(t, node, "vol-0", kept)

	// kubelet retries the publish that was in flight: the pull resumes and the volume mounts.
	start := time.Now()
	for {
		err := drvPublish(node, bigReq, 2*time.Second)
		if err == nil {
			break
		}
		drvWantCode(t, err, codes.Aborted, "")
		if time.Since(start) > time.Minute {
			t.Fatal("interrupted pull did not complete after the restart")
		}
	}
	if got, _ := os.ReadFile(filepath.Join(big, "model.safetensors")); !bytes.Equal(got, weights) {
		t.Fatal("weights differ from what was pushed")
	}
	// The restarted driver resumed the interrupted pull from its partial download instead of starting over.
	log, _ := os.ReadFile(filepath.Join(d.Root, "driver.log"))
	if !bytes.Contains(log, []byte("resuming pull interrupted by a restart")) {
		t.Error("the restarted driver did not resume the interrupted pull itself")
	}
	if sent := proxy.blobBytesOf(digestOf(weights)); sent > int64(len(weights))*5/4 {
		t.Errorf("the registry sent %d bytes for an %d-byte blob: the download restarted from zero", sent, len(weights))
	}
	drvUnpublish(t, node, "vol-big", big)
	if n := d.metric("modelpack_csi_volumes"); n != 0 {
		t.Fatalf("%v volumes left", n)
	}
	if n := d.metric("modelpack_csi_view_refs"); n != 0 {
		t.Fatalf("%v holds on views after every volume was unpublished or collected", n)
	}
}

func TestDriverErrorCodes(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	private := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: drvHtpasswd})
	testmodel.Push(t, private.Host, "models/private", "v1", drvSmallModel("private"), &auth.Credential{Username: "e2e", Password: "e2e-secret"})
	unreachable := testenv.FreeAddr(t)
	// The driver's default log format, JSON, is the one that would marshal a secret's bytes (as base64).
	d := drvStartWith(t, filepath.Join(dir, "node"), []string{"--log-format", "json"}, private.Host, unreachable)
	node := d.node()
	ref := private.Host + "/models/private:v1"
	target := drvKubelet(t, dir, "pod")
	publish := func(attrs map[string]string, secrets map[string]string) error {
		req := testenv.PublishRequest("vol", target, attrs)
		req.Secrets = secrets
		return drvPublish(node, req, time.Minute)
	}

	drvWantCode(t, publish(map[string]string{"reference": ref, "model": "llama"}, nil), codes.InvalidArgument,
		`unknown volume attribute "model"; valid keys: reference`)
	err := publish(map[string]string{"reference": ref, "pullPolicy": "Sometimes"}, nil)
	drvWantCode(t, err, codes.InvalidArgument, "Always, IfNotPresent or Never")
	drvWantCode(t, publish(map[string]string{"reference": "registry.example.com/Models/UPPER::v1"}, nil), codes.InvalidArgument, "reference")
	drvWantCode(t, publish(map[string]string{}, nil), codes.InvalidArgument, `"reference" is required`)
	drvWantCode(t, publish(map[string]string{"reference": ref}, nil), codes.Unauthenticated, "")
	drvWantCode(t, publish(map[string]string{"reference": ref}, map[string]string{".dockerconfigjson": testenv.DockerConfigJSON(private.Host, "e2e", "wrong")}), codes.Unauthenticated, "")
	drvWantCode(t, publish(map[string]string{"reference": private.Host + "/models/private:nope"},
		map[string]string{".dockerconfigjson": testenv.DockerConfigJSON(private.Host, "e2e", "e2e-secret")}), codes.NotFound, "")
	drvWantCode(t, publish(map[string]string{"reference": unreachable + "/models/x:v1"}, nil), codes.Unavailable, "")
	drvWantCode(t, publish(map[string]string{"reference": ref, "pullPolicy": "Never"}, nil), codes.FailedPrecondition, "not on this node")
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("failed publishes left the target behind: %v", err)
	}

	secret := map[string]string{".dockerconfigjson": testenv.DockerConfigJSON(private.Host, "e2e", "e2e-secret")}
	if err := publish(map[string]string{"reference": ref}, secret); err != nil {
		t.Fatalf("with the pull secret: %v", err)
	}
	if got := drvRead(t, filepath.Join(target, "model.safetensors")); got != "weights of private" {
		t.Fatalf("weights: %q", got)
	}
	drvUnpublish(t, node, "vol", target)
	log, err := os.ReadFile(filepath.Join(dir, "node", "driver.log"))
	if err != nil {
		t.Fatal(err)
	}
	// The check must be able to fail: the log is the driver's JSON and it did log this volume's publish.
	if !bytes.Contains(log, []byte(`"msg":"volume published"`)) || !bytes.Contains(log, []byte(ref)) {
		t.Fatalf("the JSON log has no publish of %s: the leak check below would prove nothing", ref)
	}
	drvNoSecret(t, filepath.Join(dir, "node"), testenv.DockerConfigJSON(private.Host, "e2e", "e2e-secret"), "e2e:e2e-secret", "e2e-secret")
}

// drvNoSecret fails if any file under root (the log, the persisted state, the cache's records) holds the pull
// secret in any encoding a logger or a JSON marshaller would write: plain, base64 (as encoding/json writes []byte),
// JSON-escaped, or its parts (the password, the user:password pair and its base64).
func drvNoSecret(t *testing.T, root, dockerConfig, userPass, password string) {
	t.Helper()
	escaped, _ := json.Marshal(dockerConfig)
	forms := map[string]string{
		"password":                  password,
		"user:password base64":      base64.StdEncoding.EncodeToString([]byte(userPass)),
		"docker config":             dockerConfig,
		"docker config JSON-quoted": strings.Trim(string(escaped), `"`),
		"docker config base64":      base64.StdEncoding.EncodeToString([]byte(dockerConfig))[:40],
	}
	filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() || strings.Contains(p, string(filepath.Separator)+"blobs"+string(filepath.Separator)) {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		for name, f := range forms {
			if bytes.Contains(b, []byte(f)) {
				t.Errorf("%s holds the pull secret (%s)", p, name)
			}
		}
		return nil
	})
}

func TestDriverFullDiskIsResourceExhausted(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	testmodel.Push(t, reg.Host, "models/huge", "v1", drvModel{"model.safetensors": randomBytes(t, 16<<20)}, nil)
	// The node's cache disk: a 6 MiB filesystem for a 16 MiB model.
	root := drvSmallDisk(t, dir, "6m")
	d := drvStart(t, root, reg.Host)
	node := d.node()
	target := drvKubelet(t, dir, "pod")
	err := drvPublish(node, testenv.PublishRequest("vol", target, map[string]string{"reference": reg.Host + "/models/huge:v1"}), time.Minute)
	drvWantCode(t, err, codes.ResourceExhausted, "")
	if n := d.metric("modelpack_csi_pull_errors_total", `code="ResourceExhausted"`); n != 1 {
		t.Fatalf("pull error metric %v, want 1", n)
	}
	d.stop()
	if err := syscall.Unmount(root, 0); err != nil {
		t.Fatal(err)
	}
}

// TestDriverRegistryMirror pulls through a mirror configured per registry in a containerd-style hosts directory,
// and falls back to the origin when the mirror is down.
func TestDriverRegistryMirror(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	mirror := drvStartProxy(t, reg.Host)
	weights := randomBytes(t, 1<<20)
	testmodel.Push(t, reg.Host, "models/mirrored", "v1", drvModel{"model.safetensors": weights}, nil)
	testmodel.Push(t, reg.Host, "models/mirrored", "v2", drvModel{"model.safetensors": []byte("v2")}, nil)
	// Pods name the model by its public name; the node knows where that registry and its mirror really are.
	const public = "models.example.internal"
	hosts := filepath.Join(dir, "hosts.d")
	if err := os.MkdirAll(filepath.Join(hosts, public), 0o755); err != nil {
		t.Fatal(err)
	}
	toml := fmt.Sprintf("server = \"http://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", reg.Host, mirror.Host)
	if err := os.WriteFile(filepath.Join(hosts, public, "hosts.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	d := drvStartWith(t, filepath.Join(dir, "node"), []string{"--hosts-dir", hosts})
	node := d.node()

	target := drvKubelet(t, dir, "pod-1")
	if err := drvPublish(node, testenv.PublishRequest("v1", target, map[string]string{"reference": public + "/models/mirrored:v1"}), time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(target, "model.safetensors")); !bytes.Equal(got, weights) {
		t.Fatal("weights differ from what was pushed")
	}
	if n := mirror.blobGetsOf(digestOf(weights)); n != 1 {
		t.Fatalf("the mirror served the weights %d times, want 1", n)
	}
	drvUnpublish(t, node, "v1", target)

	mirror.Close()
	target2 := drvKubelet(t, dir, "pod-2")
	if err := drvPublish(node, testenv.PublishRequest("v2", target2, map[string]string{"reference": public + "/models/mirrored:v2"}), time.Minute); err != nil {
		t.Fatalf("with the mirror down: %v", err)
	}
	if got := drvRead(t, filepath.Join(target2, "model.safetensors")); got != "v2" {
		t.Fatalf("weights: %q", got)
	}
	drvUnpublish(t, node, "v2", target2)
}

// TestDriverRepairsBrokenMounts removes a volume's view from under its mount while the driver runs: the driver
// rebuilds the view and remounts the target without kubelet asking.
func TestDriverRepairsBrokenMounts(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	testmodel.Push(t, reg.Host, "models/tiny", "v1", drvSmallModel("v1"), nil)
	root := filepath.Join(dir, "node")
	d := drvStartWith(t, root, []string{"--gc-interval", "200ms"}, reg.Host)
	node := d.node()
	target := drvKubelet(t, dir, "pod")
	if err := drvPublish(node, testenv.PublishRequest("vol", target, map[string]string{"reference": reg.Host + "/models/tiny:v1"}), time.Minute); err != nil {
		t.Fatal(err)
	}
	// The one model published has the one view.
	views, err := filepath.Glob(filepath.Join(root, "cache", "views", "*"))
	if err != nil || len(views) != 1 {
		t.Fatalf("views %v (%v), want the published volume's one", views, err)
	}
	view := views[0]
	if err := os.RemoveAll(view); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(filepath.Join(target, "model.safetensors")); err == nil {
		t.Fatal("the model is still readable with its view removed: the test removed nothing")
	}
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if got, err := os.ReadFile(filepath.Join(target, "model.safetensors")); err == nil && string(got) == "weights of v1" {
			break
		}
		if time.Since(start) > 20*time.Second {
			t.Fatal("the broken mount was not repaired")
		}
	}
	drvUnpublish(t, node, "vol", target)
}

// TestDriverNodeCredentials: the node's docker config is the node's. Under the default policy a pod naming no
// secret presents no credentials and a private model is refused (UNAUTHENTICATED, saying a pod presents the node's
// credentials only under NeverVerify); under NeverVerify the same pod pulls it with the node's docker config.
func TestDriverNodeCredentials(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	private := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: drvHtpasswd})
	testmodel.Push(t, private.Host, "models/private", "v1", drvSmallModel("node-creds"), &auth.Credential{Username: "e2e", Password: "e2e-secret"})
	cfg := filepath.Join(dir, "node-docker-config.json")
	if err := os.WriteFile(cfg, []byte(testenv.DockerConfigJSON(private.Host, "e2e", "e2e-secret")), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, mode := range []string{"NeverVerifyPreloadedImages", "NeverVerify"} {
		d := drvStartWith(t, filepath.Join(dir, fmt.Sprint("node", i)), []string{"--registry-config", cfg, "--image-pull-credentials-verification-policy", mode}, private.Host)
		node := d.node()
		target := drvKubelet(t, dir, fmt.Sprint("pod", i))
		err := drvPublish(node, testenv.PublishRequest("vol", target, map[string]string{"reference": private.Host + "/models/private:v1"}), time.Minute)
		if mode != "NeverVerify" {
			drvWantCode(t, err, codes.Unauthenticated, "nodePublishSecretRef")
			d.stop()
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := drvRead(t, filepath.Join(target, "model.safetensors")); got != "weights of node-creds" {
			t.Fatalf("weights: %q", got)
		}
		drvUnpublish(t, node, "vol", target)
		d.stop()
	}
}

// TestDriverDiskFullWhileExtracting: a tar layer that is small on the wire and expands past the node's free space
// (within the expansion limits, so it is the disk that refuses it) fails the publish with RESOURCE_EXHAUSTED,
// leaves no half-extracted layer behind to fill the disk, and the node goes on serving the next model.
func TestDriverDiskFullWhileExtracting(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	var layer bytes.Buffer
	zw := gzip.NewWriter(&layer)
	zw.Write(testmodel.Tar(t, "weights/model.safetensors", string(make([]byte, 24<<20))))
	zw.Close()
	pushLayers(t, reg.Host, "models/expands", "v1", false,
		rawLayer{mediaType: "application/vnd.cncf.model.weight.v1.tar+gzip", path: "weights", body: layer.Bytes()})
	small := randomBytes(t, 1<<20)
	testmodel.Push(t, reg.Host, "models/small", "v1", drvModel{"model.safetensors": small}, nil)
	// The node's cache disk: 8 MiB, for a layer of a few KiB that expands to 24 MiB.
	root := drvSmallDisk(t, dir, "8m")
	used := func() int64 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(root, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Blocks-st.Bfree) * st.Bsize
	}
	d := drvStart(t, root, reg.Host)
	node := d.node()
	err := drvPublish(node, testenv.PublishRequest("vol-expands", drvKubelet(t, dir, "pod-1"), map[string]string{"reference": reg.Host + "/models/expands:v1"}), time.Minute)
	drvWantCode(t, err, codes.ResourceExhausted, "no space left on device")
	// What the failed extraction wrote is gone: the disk holds the driver's files and the small layer blob, not
	// megabytes of a half model.
	if u := used(); u > 2<<20 {
		out, _ := exec.Command("du", "-a", root).CombinedOutput()
		t.Fatalf("%d bytes used on the node's disk after the refused extraction, want < 2 MiB:\n%s", u, out)
	}
	target := drvKubelet(t, dir, "pod-2")
	if err := drvPublish(node, testenv.PublishRequest("vol-small", target, map[string]string{"reference": reg.Host + "/models/small:v1"}), time.Minute); err != nil {
		t.Fatalf("the next model, which fits: %v", err)
	}
	if got := drvRead(t, filepath.Join(target, "model.safetensors")); got != string(small) {
		t.Fatal("the next model's weights differ from what was pushed")
	}
	drvUnpublish(t, node, "vol-small", target)
	d.stop()
}
