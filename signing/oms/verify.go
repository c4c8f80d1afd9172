package oms

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"

	sgbundle "github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/verify"
)

// Reasons a signature is refused; VerifyError carries one.
var (
	ErrWrongKey  = errors.New("wrong key")
	ErrUntrusted = errors.New("untrusted certificate")
	ErrInvalid   = errors.New("invalid signature")
)

// VerifyError is a refusal by one verifier: Reason is one of ErrWrongKey, ErrUntrusted, ErrInvalid.
type VerifyError struct {
	Reason error
	Detail string
}

func (e *VerifyError) Error() string { return e.Reason.Error() + ": " + e.Detail }
func (e *VerifyError) Unwrap() error { return e.Reason }

func refuse(reason error, format string, a ...any) error {
	return &VerifyError{Reason: reason, Detail: fmt.Sprintf(format, a...)}
}

// Verifier decides whether a signature's envelope was signed by whom it trusts.
type Verifier interface {
	VerifyEnvelope(s *Signature) error
	String() string
}

// Verify checks the envelope with v and returns the statement it signs.
func (s *Signature) Verify(v Verifier) (*Statement, error) {
	if err := v.VerifyEnvelope(s); err != nil {
		return nil, err
	}
	return s.statement, nil
}

// KeyVerifier trusts one ECDSA public key, as `model_signing verify key` does. The signature's own key hint or
// certificate does not matter: what counts is that the envelope verifies with this key.
type KeyVerifier struct {
	Name string
	pub  *ecdsa.PublicKey
	hint string
}

// NewKeyVerifier loads a PEM public key (ECDSA P-256, P-384 or P-521, the curves OMS signs with).
func NewKeyVerifier(name string, pemData []byte) (*KeyVerifier, error) {
	blk, _ := pem.Decode(pemData)
	if blk == nil {
		return nil, fmt.Errorf("%s: not a PEM public key", name)
	}
	k, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	pub, ok := k.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("%s: a %T key: OMS signs with ECDSA keys (P-256, P-384, P-521)", name, k)
	}
	if _, err := curveHash(pub); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &KeyVerifier{Name: name, pub: pub, hint: KeyHint(pub)}, nil
}

func (k *KeyVerifier) String() string { return "key " + k.Name }

// VerifyEnvelope implements Verifier.
func (k *KeyVerifier) VerifyEnvelope(s *Signature) error {
	if err := verifySig(k.pub, s); err != nil {
		if s.KeyHint != "" && s.KeyHint != k.hint {
			return refuse(ErrWrongKey, "signed with another key (the signature names key %.16s…, %s is %.16s…)", s.KeyHint, k.Name, k.hint)
		}
		return refuse(ErrWrongKey, "the signature does not verify with %s", k.Name)
	}
	return nil
}

// KeyHint is how OMS names a public key in a bundle: the hex SHA-256 of its PEM encoding.
func KeyHint(pub crypto.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	return hex.EncodeToString(sum[:])
}

// curveHash is the hash OMS pairs with each curve (sigstore's key details PKIX_ECDSA_P256_SHA_256, …).
func curveHash(pub *ecdsa.PublicKey) (crypto.Hash, error) {
	switch pub.Curve {
	case elliptic.P256():
		return crypto.SHA256, nil
	case elliptic.P384():
		return crypto.SHA384, nil
	case elliptic.P521():
		return crypto.SHA512, nil
	}
	return 0, fmt.Errorf("curve %s is not one OMS signs with (valid: P-256, P-384, P-521)", pub.Curve.Params().Name)
}

func verifySig(pub *ecdsa.PublicKey, s *Signature) error {
	h, err := curveHash(pub)
	if err != nil {
		return err
	}
	d := h.New()
	d.Write(pae(PayloadType, s.payload))
	if !ecdsa.VerifyASN1(pub, d.Sum(nil), s.sigs[0]) {
		return errors.New("signature does not verify")
	}
	return nil
}

// ChainVerifier trusts certificates chaining to its roots, as `model_signing verify certificate` does: the
// chain is checked at the signing certificate's NotBefore (the bundle has no timestamp), and the certificate must
// allow digital signatures or code signing.
type ChainVerifier struct {
	Name                 string
	roots, intermediates *x509.CertPool
}

// NewChainVerifier loads PEM certificates: self-signed ones are roots, the others intermediates.
func NewChainVerifier(name string, pemData []byte) (*ChainVerifier, error) {
	c := &ChainVerifier{Name: name, roots: x509.NewCertPool(), intermediates: x509.NewCertPool()}
	n := 0
	for rest := pemData; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if bytes.Equal(cert.RawSubject, cert.RawIssuer) && cert.CheckSignatureFrom(cert) == nil {
			c.roots.AddCert(cert)
			n++
		} else {
			c.intermediates.AddCert(cert)
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("%s: no self-signed root certificate", name)
	}
	return c, nil
}

func (c *ChainVerifier) String() string { return "certificate chain " + c.Name }

// VerifyEnvelope implements Verifier.
func (c *ChainVerifier) VerifyEnvelope(s *Signature) error {
	if len(s.Chain) == 0 {
		return refuse(ErrUntrusted, "the signature carries no certificate (it was made with a bare key)")
	}
	leaf, err := x509.ParseCertificate(s.Chain[0])
	if err != nil {
		return refuse(ErrInvalid, "signing certificate: %v", err)
	}
	inter := c.intermediates.Clone()
	for i, der := range s.Chain[1:] {
		ic, err := x509.ParseCertificate(der)
		if err != nil {
			return refuse(ErrInvalid, "certificate %d of the chain: %v", i+1, err)
		}
		inter.AddCert(ic)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: c.roots, Intermediates: inter, CurrentTime: leaf.NotBefore,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return refuse(ErrUntrusted, "signing certificate %q does not chain to %s: %v", leaf.Subject.String(), c.Name, err)
	}
	if leaf.KeyUsage&x509.KeyUsageDigitalSignature == 0 && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageCodeSigning) {
		return refuse(ErrUntrusted, "signing certificate %q allows neither digital signatures nor code signing", leaf.Subject.String())
	}
	pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return refuse(ErrInvalid, "signing certificate %q holds a %T key, not ECDSA", leaf.Subject.String(), leaf.PublicKey)
	}
	if err := verifySig(pub, s); err != nil {
		return refuse(ErrInvalid, "the signature does not verify with the key of certificate %q", leaf.Subject.String())
	}
	return nil
}

// KeylessVerifier trusts Sigstore keyless signatures (a Fulcio certificate for an OIDC identity) that verify
// against an offline trust root, as `model_signing verify sigstore --trust_config` does.
type KeylessVerifier struct {
	Name     string
	verifier *verify.Verifier
	identity verify.CertificateIdentity
}

// KeylessOptions say which checks a keyless signature must pass besides its certificate chain.
type KeylessOptions struct {
	// RequireTlog demands a transparency-log entry that verifies offline (and dates the signature); without it
	// the certificate must be valid now, which a Fulcio certificate (ten minutes) rarely is.
	RequireTlog bool
	// RequireSCT demands the certificate's certificate-transparency timestamp.
	RequireSCT bool
}

// NewKeylessVerifier verifies against tm for one identity (issuer and SAN, each a value or a regexp).
func NewKeylessVerifier(name string, tm root.TrustedMaterial, issuer, issuerRegexp, san, sanRegexp string, o KeylessOptions) (*KeylessVerifier, error) {
	id, err := verify.NewShortCertificateIdentity(issuer, issuerRegexp, san, sanRegexp)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var opts []verify.VerifierOption
	if o.RequireTlog {
		opts = append(opts, verify.WithTransparencyLog(1), verify.WithIntegratedTimestamps(1))
	} else {
		opts = append(opts, verify.WithCurrentTime())
	}
	if o.RequireSCT {
		opts = append(opts, verify.WithSignedCertificateTimestamps(1))
	}
	v, err := verify.NewVerifier(tm, opts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &KeylessVerifier{Name: name, verifier: v, identity: id}, nil
}

func (k *KeylessVerifier) String() string { return "keyless " + k.Name }

// VerifyEnvelope implements Verifier: the bundle goes to sigstore-go whole, with the statement's subject digest as
// the artifact it must name.
func (k *KeylessVerifier) VerifyEnvelope(s *Signature) error {
	if !s.Keyless {
		return refuse(ErrUntrusted, "the signature was made with a key or a certificate chain, not keyless")
	}
	var b sgbundle.Bundle
	if err := b.UnmarshalJSON(s.raw); err != nil {
		return refuse(ErrInvalid, "not a valid Sigstore bundle: %v", err)
	}
	root, err := hex.DecodeString(s.statement.RootDigest)
	if err != nil {
		return refuse(ErrInvalid, "subject digest %q is not hex", s.statement.RootDigest)
	}
	_, err = k.verifier.Verify(&b, verify.NewPolicy(verify.WithArtifactDigest("sha256", root), verify.WithCertificateIdentity(k.identity)))
	if err == nil {
		return nil
	}
	var idErr *verify.ErrNoMatchingCertificateIdentity
	if errors.As(err, &idErr) {
		return refuse(ErrUntrusted, "wrong identity: %v", err)
	}
	return refuse(ErrUntrusted, "%v", err)
}

// AnyOf accepts a signature any one of its verifiers accepts; its refusal is the last one's.
type AnyOf []Verifier

func (a AnyOf) VerifyEnvelope(s *Signature) error {
	err := error(refuse(ErrUntrusted, "no signer configured"))
	for _, v := range a {
		if err = v.VerifyEnvelope(s); err == nil {
			return nil
		}
	}
	return err
}

func (a AnyOf) String() string {
	names := make([]string, len(a))
	for i, v := range a {
		names[i] = v.String()
	}
	return strings.Join(names, ", ")
}
