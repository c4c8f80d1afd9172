package remote

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/testenv"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/oci"
	"oras.land/oras-go/v2/registry/remote/errcode"
)

func TestPushPullFetchRoundTrip(t *testing.T) {
	ctx := context.Background()
	reg, opts := plainRegistry(t)
	m := buildModel(t, 3<<20)
	dst := repoFor(t, reg.Host+"/models/llama:v1", opts)

	rec := newRecorder()
	res, err := Push(ctx, m.store, m.ref, dst, TransferOptions{Reporter: rec})
	if err != nil {
		t.Fatal(err)
	}
	if res.Descriptor.Digest != m.desc.Digest {
		t.Fatalf("pushed root %s, want %s", res.Descriptor.Digest, m.desc.Digest)
	}
	if res.Transferred != m.layerBytes() {
		t.Fatalf("first push sent %d bytes, want %d", res.Transferred, m.layerBytes())
	}
	for _, b := range m.blobs {
		if rec.status[b.Digest] != StatusTransferred {
			t.Fatalf("blob %s: status %q, want transferred", b.Digest, rec.status[b.Digest])
		}
	}

	// A second push finds every blob with HEAD and sends none.
	res, err = Push(ctx, m.store, m.ref, dst, TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Transferred != 0 {
		t.Fatalf("second push sent %d layer bytes, want 0", res.Transferred)
	}
	for _, b := range res.Blobs {
		if b.Status != StatusExists {
			t.Fatalf("second push: blob %s status %q, want exists", b.Digest, b.Status)
		}
	}

	// Pull into a cas-backed store.
	src := repoFor(t, reg.Host+"/models/llama:v1", opts)
	local := newCASStore(t)
	res, err = Pull(ctx, src, local, "local/llama:v1", TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Descriptor.Digest != m.desc.Digest || !local.has(t, m.desc) {
		t.Fatalf("pull: root %s, want %s stored", res.Descriptor.Digest, m.desc.Digest)
	}
	for _, b := range m.blobs {
		if !local.has(t, b) {
			t.Fatalf("pull: blob %s missing", b.Digest)
		}
	}
	if d, err := local.Resolve(ctx, "local/llama:v1"); err != nil || d.Digest != m.desc.Digest {
		t.Fatalf("pull: tag resolves to %v, %v", d.Digest, err)
	}

	// Fetch writes the files directly.
	dir := t.TempDir()
	res, err = Fetch(ctx, src, dir, FetchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m.checkFiles(t, dir)
	fi, err := os.Stat(filepath.Join(dir, "config.json"))
	if err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("config.json mode %v (%v), want 0640 from the file metadata", fi.Mode(), err)
	}
	if len(res.Files) != len(m.files) {
		t.Fatalf("fetch reported files %v, want %d", res.Files, len(m.files))
	}
	assertNoStaging(t, dir)

	// Filtered fetch: weights only.
	dir2 := t.TempDir()
	if _, err := Fetch(ctx, src, dir2, FetchOptions{Select: func(l artifact.Layer) bool { return l.Kind == artifact.KindWeight }}); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir2)
	if len(entries) != 2 {
		t.Fatalf("weights-only fetch wrote %d entries, want 2", len(entries))
	}
}

func assertNoStaging(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".modelpack-") {
			t.Fatalf("staging left behind: %s", e.Name())
		}
	}
}

func TestCopyMountsWithinRegistryAndTransfersAcross(t *testing.T) {
	ctx := context.Background()
	reg, opts := plainRegistry(t)
	reg2, _ := plainRegistry(t)
	m := buildModel(t, 1<<20)
	if _, err := Push(ctx, m.store, m.ref, repoFor(t, reg.Host+"/a/model:v1", opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	src := repoFor(t, reg.Host+"/a/model:v1", opts)
	res, err := Copy(ctx, src, repoFor(t, reg.Host+"/b/model", opts), TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Transferred != 0 {
		t.Fatalf("copy within a registry transferred %d bytes, want 0 (mounts)", res.Transferred)
	}
	for _, b := range res.Blobs {
		if b.Status != StatusMounted {
			t.Fatalf("blob %s: %s, want mounted", b.Digest, b.Status)
		}
	}
	if res.Reference != reg.Host+"/b/model:v1" {
		t.Fatalf("copy reference %q", res.Reference)
	}
	res, err = Copy(ctx, src, repoFor(t, reg2.Host+"/c/model:v2", opts), TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Transferred != m.layerBytes() {
		t.Fatalf("cross-registry copy transferred %d, want %d", res.Transferred, m.layerBytes())
	}
	dir := t.TempDir()
	if _, err := Fetch(ctx, repoFor(t, reg2.Host+"/c/model:v2", opts), dir, FetchOptions{}); err != nil {
		t.Fatal(err)
	}
	m.checkFiles(t, dir)
}

func TestErrorsNameRegistryRepositoryAndCause(t *testing.T) {
	ctx := context.Background()
	reg, opts := plainRegistry(t)
	_, err := Pull(ctx, repoFor(t, reg.Host+"/no/such:v1", opts), newCASStore(t), "x:v1", TransferOptions{})
	t.Log(err)
	if !errors.Is(err, ErrNotFound) || Classify(err) != ErrNotFound {
		t.Fatalf("missing manifest: %v (class %v), want ErrNotFound", err, Classify(err))
	}
	for _, want := range []string{"pull", reg.Host + "/no/such", "manifest v1", "not found"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not mention %q", err, want)
		}
	}

	// A web server that is no registry.
	web := newNotRegistry(t)
	_, err = Fetch(ctx, repoFor(t, web+"/x/y:v1", opts), t.TempDir(), FetchOptions{})
	t.Log(err)
	if Classify(err) != ErrNotOCI {
		t.Fatalf("non-registry: %v (class %v), want ErrNotOCI", err, Classify(err))
	}

	// Nothing listening.
	dead := testenv.FreeAddr(t)
	_, err = Fetch(ctx, repoFor(t, dead+"/x/y:v1", opts), t.TempDir(), FetchOptions{})
	t.Log(err)
	if Classify(err) != ErrUnavailable || !strings.Contains(err.Error(), dead) {
		t.Fatalf("dead registry: %v (class %v), want ErrUnavailable naming %s", err, Classify(err), dead)
	}

	// TLS spoken to a plain-HTTP registry.
	tlsOpts := opts
	tlsOpts.PlainHTTP = false
	_, err = Fetch(ctx, repoFor(t, reg.Host+"/x/y:v1", tlsOpts), t.TempDir(), FetchOptions{})
	t.Log(err)
	if Classify(err) != ErrTLS || !strings.Contains(err.Error(), "--plain-http") {
		t.Fatalf("https to http registry: %v (class %v), want ErrTLS suggesting --plain-http", err, Classify(err))
	}
}

func TestOneMissingLayerDoesNotStopTheOthers(t *testing.T) {
	ctx := context.Background()
	reg, opts := plainRegistry(t)
	m := buildModel(t, 1<<20)
	if _, err := Push(ctx, m.store, m.ref, repoFor(t, reg.Host+"/m/x:v1", opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	victim := m.blobs[0]
	if err := os.Remove(reg.BlobPath(victim.Digest.String())); err != nil {
		t.Fatal(err)
	}
	local := newCASStore(t)
	_, err := Pull(ctx, repoFor(t, reg.Host+"/m/x:v1", opts), local, "x:v1", TransferOptions{})
	t.Log(err)
	if Classify(err) != ErrNotFound || !strings.Contains(err.Error(), victim.Digest.String()) {
		t.Fatalf("pull with a blob gone: %v, want not found naming %s", err, victim.Digest)
	}
	for _, b := range m.blobs[1:] {
		if !local.has(t, b) {
			t.Fatalf("blob %s was not kept although only %s failed", b.Digest, victim.Digest)
		}
	}
	if local.has(t, m.desc) {
		t.Fatal("the manifest was stored although a layer is missing")
	}
}

func TestCopyWithReferrers(t *testing.T) {
	ctx := context.Background()
	reg, opts := plainRegistry(t)
	reg2, _ := plainRegistry(t)
	m := buildModel(t, 256<<10)
	src := repoFor(t, reg.Host+"/sig/model:v1", opts)
	if _, err := Push(ctx, m.store, m.ref, src, TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	// Attach a signature-like artifact through the referrers API.
	sig, err := oras.PackManifest(ctx, src, oras.PackManifestVersion1_1, "application/vnd.example.signature", oras.PackManifestOptions{
		Subject: &m.desc,
	})
	if err != nil {
		t.Fatal(err)
	}
	dst := repoFor(t, reg2.Host+"/sig/model:v1", opts)
	start := time.Now()
	if _, err := Copy(ctx, src, dst, TransferOptions{Referrers: true}); err != nil {
		t.Fatal(err)
	}
	t.Logf("copy with referrers took %v", time.Since(start))
	refs, err := dst.Predecessors(ctx, m.desc)
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) != 1 || refs[0].Digest != sig.Digest {
		t.Fatalf("referrers on the destination: %v, want the signature %s", refs, sig.Digest)
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		want error
	}{
		{&net.DNSError{Err: "no such host", Name: "nope.invalid", IsNotFound: true}, ErrUnavailable},
		{fmt.Errorf("write: %w", syscall.ENOSPC), ErrNoSpace},
		{fmt.Errorf("x: %w", cas.ErrDigestMismatch), ErrDigestMismatch},
		{&errcode.ErrorResponse{StatusCode: http.StatusForbidden}, ErrForbidden},
		{&errcode.ErrorResponse{StatusCode: http.StatusUnauthorized}, ErrUnauthorized},
		{&errcode.ErrorResponse{StatusCode: http.StatusServiceUnavailable}, ErrUnavailable},
		{x509.UnknownAuthorityError{}, ErrTLS},
		{&Error{Kind: ErrNotOCI, Err: errors.New("x")}, ErrNotOCI},
	} {
		if got := Classify(c.err); got != c.want {
			t.Errorf("Classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if Classify(nil) != nil {
		t.Error("Classify(nil) != nil")
	}
	other := errors.New("other")
	if Classify(other) != other {
		t.Error("an unknown error is not returned as is")
	}
	e := &Error{Op: "pull", Registry: "r.example", Repository: "m", Kind: ErrUnavailable,
		Err: &net.DNSError{Err: "no such host", Name: "r.example", IsNotFound: true}}
	if !strings.Contains(e.Error(), `unknown host "r.example"`) {
		t.Errorf("unknown host message: %s", e)
	}
	if retryable(e) {
		t.Error("an unknown host is retried")
	}
}

func TestFetchRange(t *testing.T) {
	ctx := context.Background()
	reg, opts := plainRegistry(t)
	m := buildModel(t, 1<<20)
	if _, err := Push(ctx, m.store, m.ref, repoFor(t, reg.Host+"/fr/model:v1", opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	repo := repoFor(t, reg.Host+"/fr/model:v1", opts)
	blob := m.blobs[0]
	want := m.files["model-00001-of-00002.safetensors"]
	for _, off := range []int64{0, 12345, blob.Size - 1} {
		rc, start, err := repo.FetchRange(ctx, blob, off)
		if err != nil || start != off {
			t.Fatalf("FetchRange at %d: start %d, %v", off, start, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, want[off:]) {
			t.Fatalf("FetchRange at %d: %d bytes (%v), want the %d from there", off, len(got), err, len(want)-int(off))
		}
	}
}

func TestFetchContainerImageLayersInOrder(t *testing.T) {
	ctx := context.Background()
	reg, opts := plainRegistry(t)
	store, err := oci.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	layer := func(files map[string]string) ocispec.Descriptor {
		var buf bytes.Buffer
		gz := gzip.NewWriter(&buf)
		tw := tar.NewWriter(gz)
		for name, body := range files {
			tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
			tw.Write([]byte(body))
		}
		tw.Close()
		gz.Close()
		d := content.NewDescriptorFromBytes(ocispec.MediaTypeImageLayerGzip, buf.Bytes())
		if err := store.Push(ctx, d, bytes.NewReader(buf.Bytes())); err != nil {
			t.Fatal(err)
		}
		return d
	}
	l1 := layer(map[string]string{"etc/app.conf": "v1\n", "etc/old.conf": "gone\n"})
	l2 := layer(map[string]string{"etc/app.conf": "v2\n", "etc/.wh.old.conf": ""})
	cfg := []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}`)
	cfgDesc := content.NewDescriptorFromBytes(ocispec.MediaTypeImageConfig, cfg)
	if err := store.Push(ctx, cfgDesc, bytes.NewReader(cfg)); err != nil {
		t.Fatal(err)
	}
	root, err := oras.PackManifest(ctx, store, oras.PackManifestVersion1_1, "", oras.PackManifestOptions{
		Layers: []ocispec.Descriptor{l1, l2}, ConfigDescriptor: &cfgDesc,
	})
	if err != nil {
		t.Fatal(err)
	}
	store.Tag(ctx, root, "v1")
	if _, err := Push(ctx, store, "v1", repoFor(t, reg.Host+"/img/app:v1", opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := Fetch(ctx, repoFor(t, reg.Host+"/img/app:v1", opts), dir, FetchOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "etc/app.conf")); string(b) != "v2\n" {
		t.Fatalf("etc/app.conf = %q, want the upper layer's", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "etc/old.conf")); !os.IsNotExist(err) {
		t.Fatalf("the whiteout was not applied: %v", err)
	}
	assertNoStaging(t, dir)
}
