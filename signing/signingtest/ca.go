// Package signingtest builds the trust material keyless tests need without network: a root → intermediate CA
// chain issuing Fulcio-like leaf certificates (code signing, SAN email, OIDC issuer extensions).
package signingtest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a root and an intermediate certificate authority.
type CA struct {
	Root, Intermediate       *x509.Certificate
	RootKey, IntermediateKey *ecdsa.PrivateKey
}

// Fulcio's OIDC issuer extensions: the legacy raw string cosign reads and the DER UTF8String sigstore-go reads.
var (
	OIDIssuerV1 = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57264, 1, 1}
	OIDIssuerV2 = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57264, 1, 8}
)

// NewCA creates a chain named cn, valid for an hour either side of now.
func NewCA(t testing.TB, cn string) *CA {
	t.Helper()
	ca := &CA{RootKey: NewKey(t), IntermediateKey: NewKey(t)}
	ca.Root = issue(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: cn + " root"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}, nil, ca.RootKey, &ca.RootKey.PublicKey)
	ca.Intermediate = issue(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: cn + " intermediate"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning},
	}, ca.Root, ca.RootKey, &ca.IntermediateKey.PublicKey)
	return ca
}

// Leaf issues a code-signing certificate for email with issuer recorded as Fulcio records it, and its key.
func (ca *CA) Leaf(t testing.TB, email, issuer string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	k := NewKey(t)
	return ca.Issue(t, &k.PublicKey, email, issuer), k
}

// Issue certifies pub as Fulcio would for an OIDC token of email from issuer.
func (ca *CA) Issue(t testing.TB, pub crypto.PublicKey, email, issuer string) *x509.Certificate {
	t.Helper()
	v2, err := asn1.MarshalWithParams(issuer, "utf8")
	if err != nil {
		t.Fatal(err)
	}
	return issue(t, &x509.Certificate{
		EmailAddresses: []string{email},
		KeyUsage:       x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning},
		ExtraExtensions: []pkix.Extension{{Id: OIDIssuerV1, Value: []byte(issuer)}, {Id: OIDIssuerV2, Value: v2}},
	}, ca.Intermediate, ca.IntermediateKey, pub)
}

// RootPEM is the root certificate alone, what a policy's certificateChain needs for classic signatures.
func (ca *CA) RootPEM() []byte { return CertPEM(ca.Root) }

// ChainPEM is the intermediate then the root, cosign's --certificate-chain order.
func (ca *CA) ChainPEM() []byte { return append(CertPEM(ca.Intermediate), CertPEM(ca.Root)...) }

// CertPEM encodes a certificate.
func CertPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// KeyPEM encodes a private key as PKCS #8 (what cosign import-key-pair reads).
func KeyPEM(t testing.TB, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// NewKey returns a P-256 key.
func NewKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// WriteFile writes content to dir/name and returns the path.
func WriteFile(t testing.TB, dir, name string, content []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

var serial atomic.Int64

func issue(t testing.TB, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, pub crypto.PublicKey) *x509.Certificate {
	t.Helper()
	tmpl.SerialNumber = big.NewInt(serial.Add(1))
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
