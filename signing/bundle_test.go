package signing

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ociremote "github.com/sigstore/cosign/v2/pkg/oci/remote"
	"github.com/sigstore/cosign/v2/pkg/types"
	sgsign "github.com/sigstore/sigstore-go/pkg/sign"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/modelpack/modelpack/signing/signingtest"
)

// caProvider plays Fulcio for sigstore-go's signer: it certifies the ephemeral key for a fixed identity.
type caProvider struct {
	t             *testing.T
	ca            *signingtest.CA
	email, issuer string
}

func (p caProvider) GetCertificate(_ context.Context, kp sgsign.Keypair, _ *sgsign.CertificateProviderOptions) ([]byte, error) {
	return p.ca.Issue(p.t, kp.GetPublicKey(), p.email, p.issuer).Raw, nil
}

// attachKeylessBundle signs an in-toto statement about subject as cosign v3 does (DSSE, cosign's sign predicate)
// with a certificate from ca, and attaches the bundle to target through the referrers API.
func attachKeylessBundle(t *testing.T, target, subject string, ca *signingtest.CA, email, issuer, predicate string) {
	t.Helper()
	sd, err := name.NewDigest(subject)
	if err != nil {
		t.Fatal(err)
	}
	stmt := fmt.Sprintf(`{"_type":"https://in-toto.io/Statement/v1","subject":[{"digest":{"sha256":%q}}],"predicateType":%q}`,
		strings.TrimPrefix(sd.DigestStr(), "sha256:"), predicate)
	kp, err := sgsign.NewEphemeralKeypair(nil)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := sgsign.Bundle(&sgsign.DSSEData{Data: []byte(stmt), PayloadType: "application/vnd.in-toto+json"}, kp,
		sgsign.BundleOptions{CertificateProvider: caProvider{t, ca, email, issuer}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := protojson.Marshal(pb)
	if err != nil {
		t.Fatal(err)
	}
	td, err := name.NewDigest(target)
	if err != nil {
		t.Fatal(err)
	}
	c := writeClient(context.Background(), plainTransports(t), td.String())
	if err := ociremote.WriteAttestationNewBundleFormat(td, b, predicate, c.oci...); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyKeylessBundle(t *testing.T) {
	host := startRegistry(t)
	dir := t.TempDir()
	ca := signingtest.NewCA(t, "bundle fulcio")
	const issuer = "https://oidc.example.com"
	chain := signingtest.WriteFile(t, dir, "chain.pem", ca.ChainPEM())
	policy := func(chainFile, subject string) *Verifier {
		p, err := NewPolicy(PolicyFile{Default: Rule{
			Keyless:   []Identity{{Issuer: issuer, Subject: subject}},
			TrustRoot: TrustRoot{CertificateChain: chainFile}, TransparencyLog: Waive, CertificateTransparency: Waive,
		}})
		if err != nil {
			t.Fatal(err)
		}
		return NewVerifier(p, plainTransports(t))
	}
	ctx := context.Background()
	ref, _ := pushModel(t, host, "models/bundle", "v1", "bundle")
	attachKeylessBundle(t, ref, ref, ca, "ci@example.com", issuer, types.CosignSignPredicateType)

	dec, err := policy(chain, "ci@example.com").Verify(ctx, ref)
	if err != nil || !dec.Verified || !strings.Contains(dec.Authority, "Sigstore bundle") {
		t.Fatalf("%+v %v", dec, err)
	}
	dec, err = policy(chain, "someone@example.com").Verify(ctx, ref)
	wantDenied(t, dec, err, ReasonIdentity)
	// A bundle carries only the leaf: without the intermediate in the trust root the chain does not build.
	rootOnly := signingtest.WriteFile(t, dir, "root.pem", ca.RootPEM())
	dec, err = policy(rootOnly, "ci@example.com").Verify(ctx, ref)
	wantDenied(t, dec, err, ReasonUntrusted)

	t.Run("bundle for another digest", func(t *testing.T) {
		victim, _ := pushModel(t, host, "models/bundle", "v2", "victim")
		attachKeylessBundle(t, victim, ref, ca, "ci@example.com", issuer, types.CosignSignPredicateType)
		dec, err := policy(chain, "ci@example.com").Verify(ctx, victim)
		wantDenied(t, dec, err, ReasonOtherDigest)
	})
	t.Run("an attestation is not a signature", func(t *testing.T) {
		m, _ := pushModel(t, host, "models/bundle", "v3", "attested")
		attachKeylessBundle(t, m, m, ca, "ci@example.com", issuer, "https://slsa.dev/provenance/v1")
		dec, err := policy(chain, "ci@example.com").Verify(ctx, m)
		wantDenied(t, dec, err, "not a cosign signature")
	})
	t.Run("unrelated referrers are ignored", func(t *testing.T) {
		m, _ := pushModel(t, host, "models/bundle", "v4", "sbom")
		d, _ := name.NewDigest(m)
		c := writeClient(ctx, plainTransports(t), d.String())
		if err := ociremote.WriteReferrer(d, "application/spdx+json", nil, map[string]string{"k": "v"}, c.oci...); err != nil {
			t.Fatal(err)
		}
		dec, err := policy(chain, "ci@example.com").Verify(ctx, m)
		wantDenied(t, dec, err, ReasonNoSignature)
	})
}
