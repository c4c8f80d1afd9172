package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc/codes"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
	"github.com/modelpack/modelpack/signing"
)

// hostileDoc streams a manifest-like document of n copies of entry in its "layers" (or "manifests") list, with a
// Content-Length when declare is set, as a hostile registry would: generated on the fly, never held in memory.
func hostileDoc(w http.ResponseWriter, mediaType, list string, n int, entry string, declare bool) {
	head := `{"schemaVersion":2,"mediaType":"` + mediaType + `",`
	if list == "layers" {
		head += `"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:` + strings.Repeat("0", 64) + `","size":2},`
	}
	head += `"` + list + `":[`
	tail := `]}`
	w.Header().Set("Content-Type", mediaType)
	if declare {
		size := len(head) + n*len(entry) + (n - 1) + len(tail)
		w.Header().Set("Content-Length", strconv.Itoa(size))
	}
	bw := bufio.NewWriterSize(w, 256<<10)
	bw.WriteString(head)
	for i := 0; i < n; i++ {
		if i > 0 {
			bw.WriteByte(',')
		}
		if _, err := bw.WriteString(entry); err != nil {
			return // the client hung up: what a refusal looks like from here
		}
	}
	bw.WriteString(tail)
	bw.Flush()
}

// peakRSS is a process's peak resident set (VmHWM) in MiB.
func peakRSS(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb / 1024
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// TestDriverRefusesHugeDocumentsCheaply serves the real driver, from a hostile registry (a real HTTP server), the
// documents an attacker would: signature manifests of 100 MiB and more (declared or chunked, 350k layers), a
// referrers list as large, and a model manifest of a million empty layers or nested 100k deep. Each publish is
// refused with FAILED_PRECONDITION naming the limit, nothing is mounted, and the driver's peak RSS stays under
// 128 MiB over all of them (before, a 100 MiB signature manifest took it from 111 to 304 MiB, and 95 MiB of 350k
// layers to 800 MiB).
func TestDriverRefusesHugeDocumentsCheaply(t *testing.T) {
	h := testenv.StartHostileRegistry(t)
	dir := t.TempDir()
	_, pub, err := signing.GenerateKeyPair(filepath.Join(dir, "trusted"), func(bool) ([]byte, error) { return []byte("pw"), nil }, false)
	if err != nil {
		t.Fatal(err)
	}
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`default: {mode: enforce, none: true}
rules:
- name: signed
  match: ["%s/signed/**"]
  mode: enforce
  keys: [%s]
  transparencyLog: waive
`, h.Host, pub)), 0o644); err != nil {
		t.Fatal(err)
	}

	// One small model per repository (the hostile registry serves any repository the same content).
	cfg := h.Blob("application/vnd.cncf.model.config.v1+json", []byte(`{"descriptor":{},"config":{},"modelfs":{"type":"layers","diffIds":[]}}`))
	weights := h.Blob("application/vnd.cncf.model.weight.v1.raw", []byte("weights"))
	weights.Annotations = map[string]string{"org.cncf.model.filepath": "model.safetensors"}
	model := h.Manifest(t, "v1", ocispec.Manifest{Versioned: specsV2, MediaType: ocispec.MediaTypeImageManifest,
		ArtifactType: "application/vnd.cncf.model.manifest.v1+json", Config: cfg, Layers: []ocispec.Descriptor{weights}}, ocispec.MediaTypeImageManifest)
	sigTag := strings.Replace(model.Digest.String(), ":", "-", 1) + ".sig"
	refTag := strings.Replace(model.Digest.String(), ":", "-", 1)
	// The tags exist, so the hostile hooks below answer their GETs.
	h.Manifest(t, sigTag, ocispec.Manifest{Versioned: specsV2}, ocispec.MediaTypeImageManifest)
	h.Manifest(t, refTag, ocispec.Index{Versioned: specsV2}, ocispec.MediaTypeImageIndex)
	var flood, chunked strings.Builder
	flood.WriteString(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":` + cfgJSON(cfg) + `,"layers":[{}`)
	for flood.Len() < 4<<20-8 {
		flood.WriteString(",{}")
	}
	flood.WriteString("]}")
	h.Raw("flood", ocispec.MediaTypeImageManifest, []byte(flood.String()))
	chunked.WriteString(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":` + cfgJSON(cfg) + `,"layers":[`)
	for i := 0; i < 350_000; i++ {
		if i > 0 {
			chunked.WriteByte(',')
		}
		chunked.WriteString(sigEntry(285))
	}
	chunked.WriteString("]}")
	h.Raw("large", ocispec.MediaTypeImageManifest, []byte(chunked.String()))
	h.Raw("deep", ocispec.MediaTypeImageManifest, []byte(strings.Repeat("[", 100_000)+strings.Repeat("]", 100_000)))

	sigLayer := sigEntry(300)
	h.OnManifest = func(w http.ResponseWriter, r *http.Request, ref string, _ []byte) bool {
		repo := strings.TrimPrefix(r.URL.Path[:strings.LastIndex(r.URL.Path, "/manifests/")], "/v2/")
		switch {
		case ref == sigTag && repo == "signed/declared": // just over 100 MiB, declared
			hostileDoc(w, ocispec.MediaTypeImageManifest, "layers", (101<<20)/(len(sigLayer)+1), sigLayer, true)
		case ref == sigTag && repo == "signed/chunked": // 95 MiB of 350k layers, no Content-Length
			hostileDoc(w, ocispec.MediaTypeImageManifest, "layers", 350_000, sigEntry(285), false)
		case ref == sigTag && repo == "signed/flood": // 4 MiB of empty layers: under the size limit, over the count
			hostileDoc(w, ocispec.MediaTypeImageManifest, "layers", (4<<20-200)/3, "{}", true)
		case ref == sigTag && repo == "signed/small":
			http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN"}]}`, http.StatusNotFound)
		case ref == refTag && repo == "signed/small": // the referrers tag schema: an index of 100 MiB
			entry := `{"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"application/vnd.dev.sigstore.bundle.v0.3+json","digest":"sha256:` + strings.Repeat("b", 64) + `","size":1}`
			hostileDoc(w, ocispec.MediaTypeImageIndex, "manifests", (101<<20)/(len(entry)+1), entry, false)
		case ref == sigTag || ref == refTag:
			http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN"}]}`, http.StatusNotFound)
		default:
			return false
		}
		return true
	}

	root := t.TempDir()
	drvCleanupMounts(t, root)
	p := drvStartWith(t, root, []string{"--policy", policy}, h.Host)
	start := peakRSS(t, p.cmd.Process.Pid)
	node := p.node()
	for _, c := range []struct{ name, ref, want string }{
		{"signature manifest of 101 MiB, declared", "signed/declared:v1", "too large"},
		{"signature manifest of 95 MiB, 350k layers, chunked", "signed/chunked:v1", "too large"},
		{"signature manifest of a million empty layers", "signed/flood:v1", "too large"},
		{"referrers index of 101 MiB", "signed/small:v1", "too large"},
		{"model manifest of a million empty layers", "plain/m:flood", "too large"},
		{"model manifest of 95 MiB, 350k layers", "plain/m:large", "too large"},
		{"model manifest nested 100k deep", "plain/m:deep", "nested more than 32 levels"},
	} {
		t.Run(c.name, func(t *testing.T) {
			target := drvKubelet(t, root, strings.NewReplacer("/", "-", ":", "-").Replace(c.ref))
			err := drvPublish(node, testenv.PublishRequest("vol-"+c.ref, target, map[string]string{
				"reference": h.Host + "/" + c.ref, "csi.storage.k8s.io/ephemeral": "true"}), time.Minute)
			drvWantCode(t, err, codes.FailedPrecondition, c.want)
			if m, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(m), target) {
				t.Fatalf("refused volume is mounted")
			}
			t.Logf("driver peak RSS so far: %.0f MiB", peakRSS(t, p.cmd.Process.Pid))
		})
	}
	if n := h.Gets(weights.Digest); n != 0 {
		t.Fatalf("%d GETs of the model's layer: refused content was pulled", n)
	}
	peak := peakRSS(t, p.cmd.Process.Pid)
	t.Logf("driver peak RSS: %.0f MiB at start, %.0f MiB after every hostile document", start, peak)
	if peak > 128 {
		t.Fatalf("driver peak RSS %.0f MiB, want ≤ 128 MiB", peak)
	}
}

var specsV2 = specs.Versioned{SchemaVersion: 2}

func cfgJSON(d ocispec.Descriptor) string {
	return fmt.Sprintf(`{"mediaType":%q,"digest":%q,"size":%d}`, d.MediaType, d.Digest, d.Size)
}

// sigEntry is a cosign signature layer descriptor of exactly size bytes of JSON.
func sigEntry(size int) string {
	head := `{"mediaType":"application/vnd.dev.cosign.simplesigning.v1+json","digest":"sha256:` + strings.Repeat("a", 64) +
		`","size":233,"annotations":{"dev.cosignproject.cosign/signature":"`
	tail := `"}}`
	return head + strings.Repeat("M", size-len(head)-len(tail)) + tail
}

type rawLayer struct {
	mediaType string
	path      string // org.cncf.model.filepath, if any
	body      []byte
}

// pushLayers pushes a manifest of these layers (a model unless image) to a real registry and returns the layers'
// digests.
func pushLayers(t *testing.T, host, repo, tag string, image bool, layers ...rawLayer) []digest.Digest {
	t.Helper()
	ctx := context.Background()
	mem := memory.New()
	push := func(mt string, b []byte, ann map[string]string) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mt, Digest: digest.FromBytes(b), Size: int64(len(b)), Annotations: ann}
		if ok, _ := mem.Exists(ctx, d); !ok {
			if err := mem.Push(ctx, d, bytes.NewReader(b)); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	m := ocispec.Manifest{Versioned: specsV2, MediaType: ocispec.MediaTypeImageManifest}
	var ds []digest.Digest
	for _, l := range layers {
		var ann map[string]string
		if l.path != "" {
			ann = map[string]string{artifact.AnnotationFilepath: l.path}
		}
		d := push(l.mediaType, l.body, ann)
		m.Layers = append(m.Layers, d)
		ds = append(ds, d.Digest)
	}
	if image {
		m.Config = push(ocispec.MediaTypeImageConfig, []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}`), nil)
	} else {
		m.ArtifactType = artifact.ArtifactTypeModelManifest
		m.Config = push(artifact.MediaTypeModelConfig, []byte(`{"descriptor":{"name":"`+repo+`"},"config":{},"modelfs":{"type":"layers","diffIds":["`+ds[0].String()+`"]}}`), nil)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	md := push(ocispec.MediaTypeImageManifest, b, nil)
	if err := mem.Tag(ctx, md, tag); err != nil {
		t.Fatal(err)
	}
	r, err := remote.NewRepository(host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	r.PlainHTTP = true
	if _, err := oras.Copy(ctx, mem, tag, r, tag, oras.DefaultCopyOptions); err != nil {
		t.Fatal(err)
	}
	return ds
}

// TestDriverRefusesOneFileInTwoLayers: a model whose file comes from two layers (two tar layers, or a raw and a tar
// layer in either order) would mount with whichever layer came last; the real driver, pulling from a real
// registry, refuses it with FAILED_PRECONDITION naming both layers, as it refuses two raw layers at one path.
// A container image keeps overlay semantics: its upper layer wins.
func TestDriverRefusesOneFileInTwoLayers(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	const docTar = "application/vnd.cncf.model.doc.v1.tar"
	const docRaw = "application/vnd.cncf.model.doc.v1.raw"
	root := t.TempDir()
	drvCleanupMounts(t, root)
	p := drvStart(t, root, reg.Host)
	node := p.node()
	publish := func(name, repo string) (string, error) {
		target := drvKubelet(t, root, name)
		return target, drvPublish(node, testenv.PublishRequest("vol-"+name, target, map[string]string{
			"reference": reg.Host + "/" + repo + ":v1", "csi.storage.k8s.io/ephemeral": "true"}), time.Minute)
	}
	for _, c := range []struct {
		name   string
		layers []rawLayer
	}{
		{"two tar layers", []rawLayer{{docTar, "docs", testmodel.Tar(t, "docs/README.md", "first")}, {docTar, "docs2", testmodel.Tar(t, "docs/README.md", "second")}}},
		{"raw then tar", []rawLayer{{docRaw, "docs/README.md", []byte("raw")}, {docTar, "docs", testmodel.Tar(t, "docs/README.md", "tar")}}},
		{"tar then raw", []rawLayer{{docTar, "docs", testmodel.Tar(t, "docs/README.md", "tar")}, {docRaw, "docs/README.md", []byte("raw")}}},
		{"a tar file where a raw layer needs a directory", []rawLayer{{docTar, "docs", testmodel.Tar(t, "docs", "a file")}, {docRaw, "docs/README.md", []byte("raw")}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			repo := "conflict/" + strings.ReplaceAll(c.name, " ", "-")
			ds := pushLayers(t, reg.Host, repo, "v1", false, c.layers...)
			target, err := publish(strings.ReplaceAll(c.name, " ", "-"), repo)
			drvWantCode(t, err, codes.FailedPrecondition, "conflicting layer paths")
			for _, d := range ds {
				if !strings.Contains(err.Error(), d.String()) {
					t.Errorf("%v does not name layer %s", err, d)
				}
			}
			if m, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(m), target) {
				t.Fatal("refused volume is mounted")
			}
			// The CLI's fetch, which writes model layers concurrently, refuses it too (the winner depended on
			// timing).
			out, err := exec.Command(testenv.Modelpack(t), "fetch", reg.Host+"/"+repo+":v1", filepath.Join(t.TempDir(), "out"), "--plain-http").CombinedOutput()
			if err == nil || !strings.Contains(string(out), "conflicting layer paths") {
				t.Fatalf("modelpack fetch: %v\n%s", err, out)
			}
			// So does unpack from the local store, which writes model layers concurrently as well.
			home := t.TempDir()
			if out, err := exec.Command(testenv.Modelpack(t), "--home", home, "pull", reg.Host+"/"+repo+":v1", "--plain-http").CombinedOutput(); err != nil {
				t.Fatalf("modelpack pull: %v\n%s", err, out)
			}
			out, err = exec.Command(testenv.Modelpack(t), "--home", home, "unpack", reg.Host+"/"+repo+":v1", filepath.Join(t.TempDir(), "out")).CombinedOutput()
			if err == nil || !strings.Contains(string(out), "conflicting layer paths") {
				t.Fatalf("modelpack unpack: %v\n%s", err, out)
			}
			for _, d := range ds {
				if !strings.Contains(string(out), d.String()) {
					t.Errorf("modelpack unpack: %s does not name layer %s", out, d)
				}
			}
		})
	}
	t.Run("a container image keeps overlay semantics", func(t *testing.T) {
		pushLayers(t, reg.Host, "images/overlay", "v1", true,
			rawLayer{ocispec.MediaTypeImageLayer, "", testmodel.Tar(t, "etc/motd", "lower")},
			rawLayer{ocispec.MediaTypeImageLayer, "", testmodel.Tar(t, "etc/motd", "upper")})
		target, err := publish("image", "images/overlay")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { drvUnpublish(t, node, "vol-image", target) })
		if got := drvRead(t, filepath.Join(target, "etc/motd")); got != "upper" {
			t.Fatalf("etc/motd = %q, want the upper layer's", got)
		}
	})
}

// TestDriverRefusesRedirectsToLocalAddresses: a registry that answers a blob GET with a redirect to a loopback or
// link-local address that is not itself (the kubelet's 127.0.0.1:10250, the metadata service 169.254.169.254, ::1,
// a DNS name resolving to loopback) must not make the node's driver connect there. The publish fails with
// FAILED_PRECONDITION naming the address and the local server sees no request; a redirect to the registry's own
// address is still followed.
func TestDriverRefusesRedirectsToLocalAddresses(t *testing.T) {
	h := testenv.StartHostileRegistry(t)
	var kubeletHits atomic.Int64
	kubelet := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kubeletHits.Add(1)
		w.Write([]byte("secrets of the node"))
	}))
	t.Cleanup(kubelet.Close)
	kubelet6, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	srv6 := &http.Server{Handler: kubelet.Config.Handler}
	go srv6.Serve(kubelet6)
	t.Cleanup(func() { srv6.Close() })
	_, kport, _ := net.SplitHostPort(strings.TrimPrefix(kubelet.URL, "http://"))

	cfg := h.Blob("application/vnd.cncf.model.config.v1+json", []byte(`{"descriptor":{},"config":{},"modelfs":{"type":"layers","diffIds":[]}}`))
	weights := h.Blob("application/vnd.cncf.model.weight.v1.raw", []byte("weights to redirect"))
	weights.Annotations = map[string]string{"org.cncf.model.filepath": "model.safetensors"}
	h.Manifest(t, "v1", ocispec.Manifest{Versioned: specsV2, MediaType: ocispec.MediaTypeImageManifest,
		ArtifactType: "application/vnd.cncf.model.manifest.v1+json", Config: cfg, Layers: []ocispec.Descriptor{weights}}, ocispec.MediaTypeImageManifest)
	targets := map[string]string{
		"loopback":        "http://127.0.0.1:" + kport + "/pods",
		"localhost":       "http://localhost:" + kport + "/pods",
		"ipv6-loopback":   "http://" + kubelet6.Addr().String() + "/pods",
		"metadata":        "http://169.254.169.254/latest/meta-data/",
		"ipv6-link-local": "http://[fe80::1]:" + kport + "/",
		"self":            "http://" + h.Host + "/v2/r/blobs/" + weights.Digest.String() + "?redirected=1",
	}
	h.OnBlob = func(w http.ResponseWriter, r *http.Request, d digest.Digest, _ []byte) bool {
		if r.URL.Query().Get("redirected") != "" || d != weights.Digest {
			return false
		}
		repo := strings.TrimPrefix(r.URL.Path[:strings.LastIndex(r.URL.Path, "/blobs/")], "/v2/")
		http.Redirect(w, r, targets[strings.TrimPrefix(repo, "redirect/")], http.StatusTemporaryRedirect)
		return true
	}
	root := t.TempDir()
	drvCleanupMounts(t, root)
	p := drvStart(t, root, h.Host)
	node := p.node()
	for _, name := range []string{"loopback", "localhost", "ipv6-loopback", "metadata", "ipv6-link-local"} {
		t.Run(name, func(t *testing.T) {
			target := drvKubelet(t, root, name)
			err := drvPublish(node, testenv.PublishRequest("vol-"+name, target, map[string]string{
				"reference": h.Host + "/redirect/" + name + ":v1", "csi.storage.k8s.io/ephemeral": "true"}), time.Minute)
			drvWantCode(t, err, codes.FailedPrecondition, "loopback or link-local address refused")
		})
	}
	if n := kubeletHits.Load(); n != 0 {
		t.Fatalf("the local server got %d requests through redirects", n)
	}
	t.Run("a redirect to the registry itself is followed", func(t *testing.T) {
		target := drvKubelet(t, root, "self")
		if err := drvPublish(node, testenv.PublishRequest("vol-self", target, map[string]string{
			"reference": h.Host + "/redirect/self:v1", "csi.storage.k8s.io/ephemeral": "true"}), time.Minute); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { drvUnpublish(t, node, "vol-self", target) })
		if got := drvRead(t, filepath.Join(target, "model.safetensors")); got != "weights to redirect" {
			t.Fatalf("read %q", got)
		}
	})
}

// TestPasswordInReferenceIsNeverRepeated: a reference with credentials in it (user:password@host/…) is refused by
// the real driver (INVALID_ARGUMENT) and by every CLI command that takes a reference, and the password appears in
// no answer, no output and no log line.
func TestPasswordInReferenceIsNeverRepeated(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	const secret = "hunter2-s3cret"
	bad := "alice:" + secret + "@" + reg.Host + "/models/m:v1"

	root := t.TempDir()
	drvCleanupMounts(t, root)
	p := drvStart(t, root, reg.Host)
	for _, ref := range []string{bad, "https://alice:" + secret + "@" + reg.Host + "/models/m:v1"} {
		err := drvPublish(p.node(), testenv.PublishRequest("vol-pw", drvKubelet(t, root, "pw"), map[string]string{
			"reference": ref, "csi.storage.k8s.io/ephemeral": "true"}), time.Minute)
		drvWantCode(t, err, codes.InvalidArgument, "may not carry credentials")
		if strings.Contains(err.Error(), secret) {
			t.Fatalf("the answer repeats the password: %v", err)
		}
	}
	p.stop()
	if b, _ := os.ReadFile(p.log); strings.Contains(string(b), secret) {
		t.Fatalf("the driver's log holds the password:\n%s", b)
	}

	mp := testenv.Modelpack(t)
	home := t.TempDir()
	for _, args := range [][]string{
		{"pull", bad, "--plain-http"},
		{"fetch", bad, filepath.Join(home, "out"), "--plain-http"},
		{"inspect", bad, "--remote", "--plain-http"},
		{"tags", "alice:" + secret + "@" + reg.Host + "/models/m", "--plain-http"},
		{"copy", bad, reg.Host + "/models/copy:v1", "--plain-http"},
		{"verify", bad, "--key", "none.pub", "--plain-http"},
		{"push", bad, "--from", "x", "--plain-http"},
		{"pull", bad, "--plain-http", "-o", "json"},
	} {
		cmd := exec.Command(mp, args...)
		cmd.Env = append(os.Environ(), "MODELPACK_HOME="+home, "HOME="+home)
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("modelpack %s succeeded", args[0])
		}
		if strings.Contains(string(out), secret) {
			t.Errorf("modelpack %s repeats the password:\n%s", args[0], out)
		}
		if !strings.Contains(string(out), "may not carry credentials") {
			t.Errorf("modelpack %s does not say why:\n%s", args[0], out)
		}
	}
}

// TestDriverNamesContentOverTheLimits: content the file system would refuse halfway through a pull (a name of 256
// bytes, a path over the limit, in a raw layer's annotation or in a tar layer) and a descriptor of size -1 are the
// content's fault: the real driver answers FAILED_PRECONDITION naming the layer and the limit (it answered
// INTERNAL), and a subPath over the limits is INVALID_ARGUMENT.
func TestDriverNamesContentOverTheLimits(t *testing.T) {
	h := testenv.StartHostileRegistry(t)
	cfg := h.Blob("application/vnd.cncf.model.config.v1+json", []byte(`{"descriptor":{},"config":{},"modelfs":{"type":"layers","diffIds":[]}}`))
	long := strings.Repeat("n", 256)
	deep := strings.Repeat(strings.Repeat("d", 200)+"/", 20) + "f"
	model := func(tag string, layers ...ocispec.Descriptor) {
		h.Manifest(t, tag, ocispec.Manifest{Versioned: specsV2, MediaType: ocispec.MediaTypeImageManifest,
			ArtifactType: artifact.ArtifactTypeModelManifest, Config: cfg, Layers: layers}, ocispec.MediaTypeImageManifest)
	}
	raw := func(path, body string) ocispec.Descriptor {
		d := h.Blob("application/vnd.cncf.model.weight.v1.raw", []byte(body))
		d.Annotations = map[string]string{artifact.AnnotationFilepath: path}
		return d
	}
	tarLayer := func(name string) ocispec.Descriptor {
		d := h.Blob("application/vnd.cncf.model.doc.v1.tar", testmodel.Tar(t, name, "x"))
		d.Annotations = map[string]string{artifact.AnnotationFilepath: "docs"}
		return d
	}
	negative := raw("w.bin", "weights")
	negative.Size = -1
	model("negative", negative)
	model("rawname", raw(long, "a long name"))
	model("rawpath", raw(deep, "a deep path"))
	tarName := tarLayer("docs/" + long)
	model("tarname", tarName)
	tarPath := tarLayer("docs/" + deep)
	model("tarpath", tarPath)
	model("ok", raw("w.bin", "weights"))

	root := t.TempDir()
	drvCleanupMounts(t, root)
	p := drvStart(t, root, h.Host)
	node := p.node()
	for _, c := range []struct{ tag, want, layer string }{
		{"negative", "negative size -1", ""},
		{"rawname", "over the limit of 255", ""},
		{"rawpath", "over the limit of 3072", ""},
		{"tarname", "over the limit of 255", tarName.Digest.String()},
		{"tarpath", "over the limit of 3072", tarPath.Digest.String()},
	} {
		t.Run(c.tag, func(t *testing.T) {
			err := drvPublish(node, testenv.PublishRequest("vol-"+c.tag, drvKubelet(t, root, c.tag), map[string]string{
				"reference": h.Host + "/m:" + c.tag, "csi.storage.k8s.io/ephemeral": "true"}), time.Minute)
			drvWantCode(t, err, codes.FailedPrecondition, c.want)
			if c.layer != "" && !strings.Contains(err.Error(), c.layer) {
				t.Fatalf("%v does not name the layer %s", err, c.layer)
			}
		})
	}
	for _, sub := range []string{long, deep + "/" + deep} {
		err := drvPublish(node, testenv.PublishRequest("vol-sub", drvKubelet(t, root, "sub"), map[string]string{
			"reference": h.Host + "/m:ok", "subPath": sub, "csi.storage.k8s.io/ephemeral": "true"}), time.Minute)
		drvWantCode(t, err, codes.InvalidArgument, "over the limit")
	}
}

// TestDriverValidatesHostsToml: a hosts.toml with a mirror the driver cannot use (file://) stops the real driver at
// start with an error naming the file and its line (it started silently and answered INTERNAL to every publish);
// a file that turns invalid while the driver runs keeps serving its last good content, and says so in the log and
// on /metrics (modelpack_csi_hosts_reload_failures_total).
func TestDriverValidatesHostsToml(t *testing.T) {
	testenv.RequireRoot(t)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	testmodel.Push(t, reg.Host, "models/m", "v1", drvModel{"w.safetensors": []byte("weights")}, nil)
	hosts := t.TempDir()
	file := filepath.Join(hosts, reg.Host, "hosts.toml")
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	bad := "server = \"http://" + reg.Host + "\"\n\n[host.\"file:///var/lib/mirror\"]\n  capabilities = [\"pull\"]\n"
	if err := os.WriteFile(file, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, testenv.Modelpack(t), "csi-driver", "--endpoint", "unix://"+filepath.Join(root, "csi.sock"),
		"--node-id", "n", "--root", root, "--metrics-addr", testenv.FreeAddr(t), "--hosts-dir", hosts).CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("the driver started with an unusable hosts.toml (%v):\n%s", err, out)
	}
	if !strings.Contains(string(out), file+":3") || !strings.Contains(string(out), "unsupported scheme") {
		t.Fatalf("the error does not name the file, the line and the cause:\n%s", out)
	}

	good := "server = \"http://" + reg.Host + "\"\n"
	if err := os.WriteFile(file, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	drvCleanupMounts(t, root)
	p := drvStartWith(t, root, []string{"--hosts-dir", hosts}, reg.Host)
	node := p.node()
	publish := func(pod string) error {
		return drvPublish(node, testenv.PublishRequest("vol-"+pod, drvKubelet(t, root, pod), map[string]string{
			"reference": reg.Host + "/models/m:v1", "pullPolicy": "Always", "csi.storage.k8s.io/ephemeral": "true"}), time.Minute)
	}
	if err := publish("a"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := publish("b"); err != nil {
		t.Fatalf("a hosts.toml turned invalid broke the registry it served: %v", err)
	}
	// The operator sees it on /metrics too, not only in the log.
	if n := p.metric("modelpack_csi_hosts_reload_failures_total"); n < 1 {
		t.Errorf("modelpack_csi_hosts_reload_failures_total = %v after a publish through an invalid hosts.toml, want >= 1", n)
	}
	for _, pod := range []string{"a", "b"} {
		drvUnpublish(t, node, "vol-"+pod, drvKubelet(t, root, pod))
	}
	p.stop()
	if b, _ := os.ReadFile(p.log); !strings.Contains(string(b), "keeping its last good content") {
		t.Fatalf("the driver's log does not say hosts.toml turned invalid:\n%s", b)
	}
}
