package signing

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/opencontainers/go-digest"
	"github.com/sigstore/cosign/v2/pkg/oci"
	"github.com/sigstore/cosign/v2/pkg/oci/mutate"
	ociremote "github.com/sigstore/cosign/v2/pkg/oci/remote"
	"github.com/sigstore/cosign/v2/pkg/oci/static"
	"github.com/sigstore/sigstore/pkg/signature/payload"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/modelpack/modelpack/internal/testenv"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
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

// countingTransport records the paths the verifier requests.
type countingTransport struct {
	mu    sync.Mutex
	paths []string
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.paths = append(c.paths, r.Method+" "+r.URL.Path)
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
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

// testCA is a root → intermediate chain issuing Fulcio-like leaf certificates.
type testCA struct {
	root, inter       *x509.Certificate
	rootKey, interKey *ecdsa.PrivateKey
}

func newTestCA(t *testing.T, cn string) *testCA {
	t.Helper()
	ca := &testCA{}
	ca.rootKey = newECKey(t)
	ca.root = issue(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: cn + " root"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}, nil, ca.rootKey, &ca.rootKey.PublicKey)
	ca.interKey = newECKey(t)
	ca.inter = issue(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: cn + " intermediate"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning},
	}, ca.root, ca.rootKey, &ca.interKey.PublicKey)
	return ca
}

var (
	oidIssuerV1 = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57264, 1, 1}
	oidIssuerV2 = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57264, 1, 8}
)

// leaf issues a short-lived code-signing certificate for email, recording issuer as Fulcio does.
func (ca *testCA) leaf(t *testing.T, email, issuer string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	k := newECKey(t)
	v2, err := asn1.MarshalWithParams(issuer, "utf8")
	if err != nil {
		t.Fatal(err)
	}
	c := issue(t, &x509.Certificate{
		Subject: pkix.Name{}, EmailAddresses: []string{email},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning},
		ExtraExtensions: []pkix.Extension{{Id: oidIssuerV1, Value: []byte(issuer)}, {Id: oidIssuerV2, Value: v2}},
	}, ca.inter, ca.interKey, &k.PublicKey)
	return c, k
}

func (ca *testCA) rootPEM() string { return string(certPEM(ca.root)) }

func newECKey(t *testing.T) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var serial int64

func issue(t *testing.T, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, pub *ecdsa.PublicKey) *x509.Certificate {
	t.Helper()
	serial++
	tmpl.SerialNumber = big.NewInt(serial)
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(time.Hour)
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func certPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// signKeyless attaches a keyless-style signature of digestRef made with leafKey, carrying the certificate and
// chain annotations as cosign does.
func signKeyless(t *testing.T, digestRef string, ca *testCA, leaf *x509.Certificate, leafKey *ecdsa.PrivateKey) {
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
	chain := append(certPEM(ca.inter), certPEM(ca.root)...)
	sig, err := static.NewSignature(pl, base64.StdEncoding.EncodeToString(raw), static.WithCertChain(certPEM(leaf), chain))
	if err != nil {
		t.Fatal(err)
	}
	writeSignature(t, d, sig)
}

func writeSignature(t *testing.T, d name.Digest, sig oci.Signature) {
	t.Helper()
	c := RegistryOptions{}.client(context.Background(), http.DefaultTransport)
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
