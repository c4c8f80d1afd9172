package signing

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	cbundle "github.com/sigstore/cosign/v2/pkg/cosign/bundle"
	"github.com/sigstore/cosign/v2/pkg/oci"
	"github.com/sigstore/cosign/v2/pkg/oci/mutate"
	ociremote "github.com/sigstore/cosign/v2/pkg/oci/remote"
	"github.com/sigstore/cosign/v2/pkg/oci/static"
	"github.com/sigstore/cosign/v2/pkg/types"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/dsse"
	"github.com/sigstore/sigstore/pkg/signature/options"

	"github.com/modelpack/modelpack/scan"
)

// ScanPredicateType is the in-toto predicate type of a scan attestation: the per-file report of `modelpack scan`
// over the layers of one manifest, signed as cosign signs attestations. `cosign verify-attestation --type` takes
// it as it is.
const ScanPredicateType = "https://modelpack.dev/scan/v1"

// inTotoStatementV1 is the in-toto Statement v1 type (github.com/in-toto/attestation, spec/v1/statement.md).
const inTotoStatementV1 = "https://in-toto.io/Statement/v1"

// ScanPredicate is the predicate of a scan attestation: what the scanner found in every layer of the subject
// manifest. Files lists each layer once, in manifest order.
type ScanPredicate struct {
	// Scanner names the program and version that scanned ("modelpack v0.4.0").
	Scanner string        `json:"scanner"`
	Files   []ScannedFile `json:"files"`
}

// ScannedFile is one layer's scan report: the file (or, for a tar layer, the directory) it holds in the model.
type ScannedFile struct {
	// Path is the layer's path in the model (its filepath annotation or title).
	Path string `json:"path"`
	// Layer is the layer's digest in the subject manifest.
	Layer string `json:"layer"`
	Size  int64  `json:"size"`
	// Format is what the content is, read from its bytes (scan.Report.Format).
	Format  string       `json:"format"`
	Verdict scan.Verdict `json:"verdict"`
	Reason  string       `json:"reason,omitempty"`
	// Callables are the distinct callables a pickle in the layer imports or calls, in file order.
	Callables []string `json:"callables,omitempty"`
	// Findings are the scanner's findings as scan.Report has them: a tar layer's name the member files they are in,
	// which the policy's exceptions match.
	Findings []scan.Finding `json:"findings,omitempty"`
}

// NewScannedFile records a layer's report for a scan predicate.
func NewScannedFile(layer string, fr scan.FileReport) ScannedFile {
	f := ScannedFile{Path: fr.Path, Layer: layer, Size: fr.Size, Format: fr.Format, Verdict: fr.Verdict, Reason: fr.Reason, Findings: fr.Findings}
	seen := map[string]bool{}
	for _, x := range fr.Findings {
		if x.Callable != "" && !seen[x.Callable] {
			seen[x.Callable] = true
			f.Callables = append(f.Callables, x.Callable)
		}
	}
	return f
}

func (f ScannedFile) report() scan.Report {
	return scan.Report{Format: f.Format, Verdict: f.Verdict, Reason: f.Reason, Findings: f.Findings}
}

// scanStatement is an in-toto Statement v1 whose predicate is a scan report.
type scanStatement struct {
	Type          string          `json:"_type"`
	Subject       []subject       `json:"subject"`
	PredicateType string          `json:"predicateType"`
	Predicate     json.RawMessage `json:"predicate"`
}

type subject struct {
	Name   string            `json:"name,omitempty"`
	Digest map[string]string `json:"digest"`
}

// AttestOptions configure AttestScan.
type AttestOptions struct {
	SignOptions
	// NewBundleFormat stores the attestation as a Sigstore bundle referrer (cosign attest --new-bundle-format)
	// instead of in the sha256-<hex>.att tag.
	NewBundleFormat bool
}

// AttestScan signs a scan attestation about the manifest digestRef names (repo@sha256:…, never a tag: the digest
// scanned is the digest attested) with a cosign private key and stores it as `cosign attest --tlog-upload=false`
// does: a DSSE envelope (payloadType application/vnd.in-toto+json) carrying an in-toto Statement v1 whose
// subject is the manifest digest and whose predicate is pred, in the sha256-<hex>.att tag with the predicateType
// annotation cosign writes, or, with NewBundleFormat, as a Sigstore bundle referrer (what cosign attest
// --new-bundle-format writes). In the tag, attesting the same statement again with the same key leaves one
// attestation and a different statement is added beside earlier ones, as cosign attest does without --replace;
// each bundle is a referrer of its own. It returns where the attestation was stored (the tag, or a description
// of the referrer).
func AttestScan(ctx context.Context, digestRef, keyRef string, pred ScanPredicate, opts AttestOptions) (string, error) {
	d, err := name.NewDigest(digestRef)
	if err != nil {
		return "", fmt.Errorf("attest: %q is not a digest reference (repo@sha256:…): %w", digestRef, err)
	}
	if len(pred.Files) == 0 {
		return "", fmt.Errorf("attest %s: the scan report lists no file", d)
	}
	sv, err := loadSigner(keyRef, opts.SecretsDir, opts.Password)
	if err != nil {
		return "", err
	}
	predJSON, err := json.Marshal(pred)
	if err != nil {
		return "", err
	}
	h := d.DigestStr()
	algo, hexDigest, _ := strings.Cut(h, ":")
	st, err := json.Marshal(scanStatement{
		Type:          inTotoStatementV1,
		Subject:       []subject{{Name: d.Repository.String(), Digest: map[string]string{algo: hexDigest}}},
		PredicateType: ScanPredicateType,
		Predicate:     predJSON,
	})
	if err != nil {
		return "", err
	}
	envelope, err := dsse.WrapSigner(sv, types.IntotoPayloadType).SignMessage(bytes.NewReader(st), options.WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("attest: %w", err)
	}
	c := writeClient(ctx, opts.Registry, d.String())
	if opts.NewBundleFormat {
		pub, err := sv.PublicKey()
		if err != nil {
			return "", err
		}
		pubPEM, err := cryptoutils.MarshalPublicKeyToPEM(pub)
		if err != nil {
			return "", err
		}
		b, err := cbundle.MakeNewBundle(pub, nil, st, envelope, pubPEM, nil)
		if err != nil {
			return "", fmt.Errorf("attest: %w", err)
		}
		if err := ociremote.WriteAttestationNewBundleFormat(d, b, ScanPredicateType, c.oci...); err != nil {
			return "", fmt.Errorf("attest: storing the attestation of %s: %w", d, err)
		}
		return "a Sigstore bundle referrer of " + d.String(), nil
	}
	att, err := static.NewAttestation(envelope, static.WithLayerMediaType(types.DssePayloadType),
		static.WithAnnotations(map[string]string{"predicateType": ScanPredicateType}))
	if err != nil {
		return "", err
	}
	se, err := ociremote.SignedEntity(d, c.oci...)
	var notFound *ociremote.EntityNotFoundError
	switch {
	case errors.As(err, &notFound):
		return "", fmt.Errorf("attest: %s not found in the registry", d)
	case err != nil:
		return "", fmt.Errorf("attest: reading %s: %w", d, err)
	}
	tag, err := ociremote.AttestationTag(d, c.oci...)
	if err != nil {
		return "", err
	}
	// cosign's duplicate detector compares layer digests, and no two DSSE envelopes share one (ECDSA signatures
	// are randomised): an attestation already there is recognised by its statement and its signer instead.
	existing, err := classicAttestations(tag, c)
	if err != nil {
		return "", fmt.Errorf("attest: %w", err)
	}
	for _, a := range existing {
		if sameStatement(a, st, sv) {
			return tag.String(), nil
		}
	}
	attested, err := mutate.AttachAttestationToEntity(se, att)
	if err != nil {
		return "", err
	}
	if err := ociremote.WriteAttestations(d.Repository, attested, c.oci...); err != nil {
		return "", fmt.Errorf("attest: storing the attestation of %s: %w", d, err)
	}
	return tag.String(), nil
}

// sameStatement reports whether att is a DSSE envelope of statement st signed by v.
func sameStatement(att oci.Signature, st []byte, v signature.Verifier) bool {
	env, err := att.Payload()
	if err != nil || dsse.WrapVerifier(v).VerifySignature(bytes.NewReader(env), nil) != nil {
		return false
	}
	var e struct {
		Payload string `json:"payload"`
	}
	if json.Unmarshal(env, &e) != nil {
		return false
	}
	got, err := base64.StdEncoding.DecodeString(e.Payload)
	return err == nil && bytes.Equal(got, st)
}
