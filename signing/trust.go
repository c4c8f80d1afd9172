package signing

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"github.com/sigstore/cosign/v2/pkg/cosign"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/tuf"
)

// trustRoot is a TrustRoot loaded for both verifiers cosign has: sigstore-go's TrustedMaterial (bundles, and
// classic signatures when a trusted_root.json is given) and the legacy pools and key sets, which let classic
// signatures bring their intermediates in the dev.sigstore.cosign/chain annotation.
type trustRoot struct {
	tm     root.TrustedMaterial
	legacy bool // classic signatures use the pools and keys below

	roots, intermediates *x509.CertPool
	rekorKeys, ctKeys    *cosign.TrustedTransparencyLogPubKeys
}

func (t *trustRoot) hasRekor() bool { return len(t.tm.RekorLogs()) > 0 }
func (t *trustRoot) hasCTLog() bool { return len(t.tm.CTLogs()) > 0 }
func (t *trustRoot) hasCA() bool    { return len(t.tm.FulcioCertificateAuthorities()) > 0 }

func (l *loader) trustRoot(tr TrustRoot, path string) (*trustRoot, error) {
	if tr.TrustedRoot != "" {
		if tr.CertificateChain != "" || len(tr.CTLogKeys) > 0 || len(tr.RekorKeys) > 0 {
			return nil, fmt.Errorf("%s.trustedRoot cannot be combined with certificateChain, ctLogKeys or rekorKeys: put them in the trusted_root.json", path)
		}
		data, err := l.file(tr.TrustedRoot)
		if err != nil {
			return nil, fmt.Errorf("%s.trustedRoot: %w", path, err)
		}
		r, err := root.NewTrustedRootFromJSON(data)
		if err != nil {
			return nil, fmt.Errorf("%s.trustedRoot: %s is not a Sigstore trusted_root.json: %w", path, tr.TrustedRoot, err)
		}
		return &trustRoot{tm: r}, nil
	}
	t := &trustRoot{legacy: true}
	var cas []root.CertificateAuthority
	if tr.CertificateChain != "" {
		data, err := l.file(tr.CertificateChain)
		if err != nil {
			return nil, fmt.Errorf("%s.certificateChain: %w", path, err)
		}
		certs, err := cryptoutils.UnmarshalCertificatesFromPEM(data)
		if err != nil || len(certs) == 0 {
			return nil, fmt.Errorf("%s.certificateChain: %s holds no PEM certificates", path, tr.CertificateChain)
		}
		t.roots = x509.NewCertPool()
		var roots, inter []*x509.Certificate
		for _, c := range certs {
			if bytes.Equal(c.RawSubject, c.RawIssuer) && c.CheckSignatureFrom(c) == nil {
				roots = append(roots, c)
				t.roots.AddCert(c)
			} else {
				inter = append(inter, c)
			}
		}
		if len(roots) == 0 {
			return nil, fmt.Errorf("%s.certificateChain: %s has no self-signed root certificate", path, tr.CertificateChain)
		}
		if len(inter) > 0 {
			t.intermediates = x509.NewCertPool()
			for _, c := range inter {
				t.intermediates.AddCert(c)
			}
		}
		for _, r := range roots {
			cas = append(cas, &root.FulcioCertificateAuthority{Root: r, Intermediates: inter})
		}
	}
	var err error
	var rekor, ct map[string]*root.TransparencyLog
	if rekor, t.rekorKeys, err = l.logKeys(tr.RekorKeys, path+".rekorKeys"); err != nil {
		return nil, err
	}
	if ct, t.ctKeys, err = l.logKeys(tr.CTLogKeys, path+".ctLogKeys"); err != nil {
		return nil, err
	}
	if t.tm, err = root.NewTrustedRoot(root.TrustedRootMediaType01, cas, ct, nil, rekor); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// logKeys loads transparency-log public keys, indexed by log ID (SHA-256 of the DER key, RFC 6962 §3.2).
func (l *loader) logKeys(files []string, path string) (map[string]*root.TransparencyLog, *cosign.TrustedTransparencyLogPubKeys, error) {
	if len(files) == 0 {
		return nil, nil, nil
	}
	logs := map[string]*root.TransparencyLog{}
	keys := cosign.NewTrustedTransparencyLogPubKeys()
	for i, f := range files {
		data, err := l.file(f)
		if err != nil {
			return nil, nil, fmt.Errorf("%s[%d]: %w", path, i, err)
		}
		pub, err := cryptoutils.UnmarshalPEMToPublicKey(data)
		if err != nil {
			return nil, nil, fmt.Errorf("%s[%d]: %s is not a PEM public key: %w", path, i, f, err)
		}
		if err := keys.AddTransparencyLogPubKey(data, tuf.Active); err != nil {
			return nil, nil, fmt.Errorf("%s[%d]: %w", path, i, err)
		}
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			return nil, nil, fmt.Errorf("%s[%d]: %w", path, i, err)
		}
		id := sha256.Sum256(der)
		logs[hex.EncodeToString(id[:])] = &root.TransparencyLog{
			ID: id[:], HashFunc: crypto.SHA256, PublicKey: pub, SignatureHashFunc: crypto.SHA256,
		}
	}
	return logs, &keys, nil
}

func (l *loader) file(path string) ([]byte, error) {
	if strings.Contains(path, "://") {
		return nil, fmt.Errorf("%s: trust-root files are plain paths", path)
	}
	return l.read(path, "")
}

// authority is one way to satisfy a rule: a public key or a keyless identity, with cosign's check options for
// classic signatures (co) and for Sigstore bundles (bundleCO). RegistryClientOpts are added per call.
type authority struct {
	desc     string
	keyless  bool
	verifier signature.Verifier
	co       cosign.CheckOpts
	bundleCO cosign.CheckOpts
}

func (l *loader) keyAuthority(ref string, tr *trustRoot, tlog Check) (*authority, error) {
	v, err := l.publicKey(ref)
	if err != nil {
		return nil, err
	}
	a := &authority{desc: "key " + ref, verifier: v}
	a.co = cosign.CheckOpts{SigVerifier: v, IgnoreTlog: tlog == Waive, IgnoreSCT: true}
	tr.applyTlog(&a.co)
	a.bundleCO = cosign.CheckOpts{SigVerifier: v, IgnoreTlog: tlog == Waive, IgnoreSCT: true, TrustedMaterial: tr.tm}
	return a, nil
}

func keylessAuthority(id Identity, tr *trustRoot, tlog, sct Check) (*authority, error) {
	if (id.Issuer == "") == (id.IssuerRegExp == "") {
		return nil, fmt.Errorf("set exactly one of issuer and issuerRegExp (the OIDC issuer in the certificate)")
	}
	if (id.Subject == "") == (id.SubjectRegExp == "") {
		return nil, fmt.Errorf("set exactly one of subject and subjectRegExp (the certificate's SAN email or URI)")
	}
	for _, re := range []struct{ field, v string }{{"issuerRegExp", id.IssuerRegExp}, {"subjectRegExp", id.SubjectRegExp}} {
		if _, err := regexp.Compile(re.v); err != nil {
			return nil, fmt.Errorf("%s: %v", re.field, err)
		}
	}
	cid := cosign.Identity{Issuer: id.Issuer, IssuerRegExp: id.IssuerRegExp, Subject: id.Subject, SubjectRegExp: id.SubjectRegExp}
	a := &authority{desc: "keyless " + identityString(id), keyless: true}
	a.co = cosign.CheckOpts{Identities: []cosign.Identity{cid}, IgnoreTlog: tlog == Waive, IgnoreSCT: sct == Waive}
	if tr.legacy {
		a.co.RootCerts, a.co.IntermediateCerts, a.co.CTLogPubKeys = tr.roots, tr.intermediates, tr.ctKeys
	} else {
		a.co.TrustedMaterial = tr.tm
	}
	tr.applyTlog(&a.co)
	a.bundleCO = cosign.CheckOpts{Identities: []cosign.Identity{cid}, IgnoreTlog: tlog == Waive, IgnoreSCT: sct == Waive, TrustedMaterial: tr.tm}
	return a, nil
}

func (t *trustRoot) applyTlog(co *cosign.CheckOpts) {
	if co.IgnoreTlog {
		return
	}
	if t.legacy {
		co.RekorPubKeys = t.rekorKeys
	} else {
		co.TrustedMaterial = t.tm
	}
	// No Rekor client: entries are checked offline from the bundle the signature carries.
	co.Offline = true
}

func identityString(id Identity) string {
	s, i := id.Subject, id.Issuer
	if s == "" {
		s = "~" + id.SubjectRegExp
	}
	if i == "" {
		i = "~" + id.IssuerRegExp
	}
	return fmt.Sprintf("subject %s issuer %s", s, i)
}
