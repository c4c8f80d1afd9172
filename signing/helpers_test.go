package signing

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sigstore/cosign/v2/pkg/oci"
	"github.com/sigstore/cosign/v2/pkg/oci/mutate"
	ociremote "github.com/sigstore/cosign/v2/pkg/oci/remote"
	"github.com/sigstore/cosign/v2/pkg/oci/static"
	"github.com/sigstore/sigstore/pkg/signature/payload"
	"golang.org/x/crypto/bcrypt"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"

	mpremote "github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/signing/signingtest"
)

const testPassword = "correct horse"

func testPass(bool) ([]byte, error) { return []byte(testPassword), nil }

// pushModel pushes a small ModelPack-typed artifact whose content depends on seed and returns its digest ref.
func pushModel(t *testing.T, host, repo, tag, seed string) (string, ocispec.Descriptor) {
	t.Helper()
	dst, err := remote.NewRepository(host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	dst.PlainHTTP = true
	return pushModelTo(t, dst, tag, seed)
}

func pushModelTo(t *testing.T, dst *remote.Repository, tag, seed string) (string, ocispec.Descriptor) {
	t.Helper()
	ctx := context.Background()
	store := memory.New()
	blob := []byte("weights of " + seed)
	layer := ocispec.Descriptor{MediaType: "application/vnd.cncf.model.weight.v1.raw", Digest: digestOf(blob), Size: int64(len(blob)),
		Annotations: map[string]string{"org.cncf.model.filepath": "model.safetensors"}}
	if err := store.Push(ctx, layer, bytes.NewReader(blob)); err != nil {
		t.Fatal(err)
	}
	cfg := []byte(`{"descriptor":{"name":"` + seed + `"},"config":{},"modelfs":{"type":"layers","diffIds":["` + layer.Digest.String() + `"]}}`)
	cfgDesc := ocispec.Descriptor{MediaType: "application/vnd.cncf.model.config.v1+json", Digest: digestOf(cfg), Size: int64(len(cfg))}
	if err := store.Push(ctx, cfgDesc, bytes.NewReader(cfg)); err != nil {
		t.Fatal(err)
	}
	m, err := oras.PackManifest(ctx, store, oras.PackManifestVersion1_1, "application/vnd.cncf.model.manifest.v1+json",
		oras.PackManifestOptions{Layers: []ocispec.Descriptor{layer}, ConfigDescriptor: &cfgDesc})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Tag(ctx, m, tag); err != nil {
		t.Fatal(err)
	}
	if _, err := oras.Copy(ctx, store, tag, dst, tag, oras.DefaultCopyOptions); err != nil {
		t.Fatal(err)
	}
	return dst.Reference.Registry + "/" + dst.Reference.Repository + "@" + m.Digest.String(), layer
}

func digestOf(b []byte) digest.Digest { return digest.FromBytes(b) }

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// newKeys writes a cosign key pair under dir and returns the private and public key paths.
func newKeys(t *testing.T, dir, prefix string) (string, string) {
	t.Helper()
	k, p, err := GenerateKeyPair(filepath.Join(dir, prefix), testPass, false)
	if err != nil {
		t.Fatal(err)
	}
	return k, p
}

func keyPolicy(t *testing.T, mode Mode, pubs ...string) *Policy {
	t.Helper()
	p, err := NewPolicy(PolicyFile{Default: Rule{Mode: mode, Keys: pubs, TransparencyLog: Waive}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// countingTransport records the requests that go out on the wire, each after delay (a far or loaded registry).
type countingTransport struct {
	mu    sync.Mutex
	paths []string
	delay time.Duration
}

// options is the plain-HTTP registry layer with c watching its wire (Options.WrapTransport).
func (c *countingTransport) options() mpremote.Options {
	return mpremote.Options{PlainHTTP: true, WrapTransport: func(next http.RoundTripper) http.RoundTripper {
		return countingHop{c, next}
	}}
}

type countingHop struct {
	c    *countingTransport
	next http.RoundTripper
}

func (h countingHop) RoundTrip(r *http.Request) (*http.Response, error) {
	h.c.mu.Lock()
	h.c.paths = append(h.c.paths, r.Method+" "+r.URL.Path)
	h.c.mu.Unlock()
	time.Sleep(h.c.delay)
	return h.next.RoundTrip(r)
}

// transports is the registry layer of o, without the user's docker config unless o names one.
func transports(t testing.TB, o mpremote.Options) *mpremote.Transports {
	t.Helper()
	if o.RegistryConfig == "" {
		o.RegistryConfig = filepath.Join(t.TempDir(), "config.json")
	}
	ts, err := mpremote.NewTransports(o)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// plainTransports reaches the tests' loopback registries: plain HTTP, anonymous.
func plainTransports(t testing.TB) *mpremote.Transports {
	return transports(t, mpremote.Options{PlainHTTP: true})
}

func (c *countingTransport) reset() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.paths
	c.paths = nil
	return p
}

func (c *countingTransport) contains(s string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.paths {
		if strings.Contains(p, s) {
			return true
		}
	}
	return false
}

// signKeyless attaches a keyless-style signature of digestRef made with leafKey, carrying the certificate and
// chain annotations as cosign does.
func signKeyless(t *testing.T, digestRef string, ca *signingtest.CA, leaf *x509.Certificate, leafKey *ecdsa.PrivateKey) {
	t.Helper()
	d, err := name.NewDigest(digestRef)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := (&payload.Cosign{Image: d}).MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(pl)
	raw, err := ecdsa.SignASN1(rand.Reader, leafKey, h[:])
	if err != nil {
		t.Fatal(err)
	}
	sig, err := static.NewSignature(pl, base64.StdEncoding.EncodeToString(raw), static.WithCertChain(signingtest.CertPEM(leaf), ca.ChainPEM()))
	if err != nil {
		t.Fatal(err)
	}
	writeSignature(t, d, sig)
}

func writeSignature(t *testing.T, d name.Digest, sig oci.Signature) {
	t.Helper()
	c := writeClient(context.Background(), plainTransports(t), d.String())
	se, err := ociremote.SignedEntity(d, c.oci...)
	if err != nil {
		t.Fatal(err)
	}
	signed, err := mutate.AttachSignatureToEntity(se, sig)
	if err != nil {
		t.Fatal(err)
	}
	if err := ociremote.WriteSignatures(d.Repository, signed, c.oci...); err != nil {
		t.Fatal(err)
	}
}

func startRegistry(t *testing.T) string {
	t.Helper()
	return testenv.StartRegistry(t, testenv.RegistryOptions{}).Host
}

// startPrivateRegistry starts a registry with basic auth and returns its host and the credentials it accepts.
func startPrivateRegistry(t *testing.T) (string, auth.CredentialFunc) {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	host := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: "puller:" + string(hash) + "\n"}).Host
	return host, func(context.Context, string) (auth.Credential, error) {
		return auth.Credential{Username: "puller", Password: "s3cret"}, nil
	}
}

// pushPrivateModel is pushModel to a registry that wants credentials.
func pushPrivateModel(t *testing.T, host, repo string, cred auth.CredentialFunc, seed string) string {
	t.Helper()
	dst, err := remote.NewRepository(host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	dst.PlainHTTP = true
	dst.Client = &auth.Client{Credential: cred}
	ref, _ := pushModelTo(t, dst, "v1", seed)
	return ref
}
