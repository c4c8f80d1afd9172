package signing

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sigstore/cosign/v2/pkg/cosign"
	"github.com/sigstore/cosign/v2/pkg/oci"
	"github.com/sigstore/cosign/v2/pkg/oci/empty"
	"github.com/sigstore/cosign/v2/pkg/oci/mutate"
	ociremote "github.com/sigstore/cosign/v2/pkg/oci/remote"
	"github.com/sigstore/cosign/v2/pkg/oci/static"
	"github.com/sigstore/sigstore/pkg/signature/dsse"

	"github.com/modelpack/modelpack/artifact"
)

// Reasons only scan-attestation checks give.
const (
	ReasonNoScanAttestation = "no scan attestation"
	ReasonScanIncomplete    = "scan attestation incomplete"
)

// attestedScan is a scan attestation that verified: who signed it and its statement.
type attestedScan struct {
	by        string
	statement []byte
}

// checkScanAttestation requires what the rule's scanAttestation says: at least one scan attestation for exactly
// d signed by one of the rule's scanners, and every one of them covering each layer of the manifest with verdicts
// the rule allows. A failure is a precondition (the content is not vouched for), not a denial of the signer.
func checkScanAttestation(ctx context.Context, r *rule, d name.Digest, c client) (verdict, error) {
	h, err := v1.NewHash(d.DigestStr())
	if err != nil {
		return verdict{}, err
	}
	names := make([]string, len(r.scanners))
	for i, a := range r.scanners {
		names[i] = a.desc
	}
	required := "a scan attestation (" + ScanPredicateType + ") by " + strings.Join(names, " or ")
	deny := func(reason, detail string) verdict {
		return verdict{reason: fmt.Sprintf("%s: %s is required: %s", reason, required, detail), unsafe: true}
	}
	var f failures
	var found []attestedScan
	n := 0

	// The sha256-<hex>.att tag: cosign attest's DSSE envelopes, each checked as cosign verify-attestation does.
	attTag, err := ociremote.AttestationTag(d, c.oci...)
	if err != nil {
		return verdict{}, err
	}
	atts, err := classicAttestations(attTag, c)
	if err != nil {
		return verdict{}, err
	}
	for _, att := range atts {
		n++
		for _, a := range r.scanners {
			st, fail := checkClassicAttestation(ctx, a, att, h, c)
			if fail != nil {
				f.add(*fail)
				continue
			}
			found = append(found, attestedScan{by: a.desc, statement: st})
		}
	}
	// Sigstore bundle referrers (cosign attest --new-bundle-format).
	bundles, err := sigstoreBundles(d, c)
	if err != nil {
		return verdict{}, err
	}
	for _, b := range bundles {
		n++
		if b.err != nil {
			f.add(failure{ReasonInvalid, fmt.Sprintf("bundle %s: %v", b.digest, b.err)})
			continue
		}
		for _, a := range r.scanners {
			if fail := checkBundleOf(ctx, a, b.bundle, h, ScanPredicateType, "a scan attestation"); fail != nil {
				f.add(*fail)
				continue
			}
			found = append(found, attestedScan{by: a.desc + " (Sigstore bundle)", statement: b.bundle.GetDsseEnvelope().GetPayload()})
		}
	}
	if len(found) == 0 {
		if n == 0 {
			return deny(ReasonNoScanAttestation, fmt.Sprintf("neither an attestation in %s nor a Sigstore bundle referrer for %s (attest one with modelpack scan REF --attest --key KEY)", attTag.TagStr(), d.DigestStr())), nil
		}
		best := failure{ReasonNoScanAttestation, "none of them is a scan attestation"}
		if f.best != nil {
			best = *f.best
		}
		return deny(best.reason, fmt.Sprintf("%s (%d attestation(s) and bundle(s) checked)", best.detail, n)), nil
	}

	// The statements are the scanners' word on each layer of this manifest: all of it must hold.
	layers, fault, err := manifestLayers(d, c)
	if err != nil || fault != "" {
		return verdict{reason: fault, unsafe: true}, err
	}
	repo := repoKey(d.Context())
	for _, s := range found {
		var st struct {
			Predicate ScanPredicate `json:"predicate"`
		}
		if err := json.Unmarshal(s.statement, &st); err != nil {
			return deny(ReasonInvalid, fmt.Sprintf("the scan attestation by %s has a predicate that is not a scan report: %v", s.by, err)), nil
		}
		byLayer := map[string]ScannedFile{}
		for _, sf := range st.Predicate.Files {
			byLayer[sf.Layer] = sf
		}
		for _, l := range layers {
			sf, ok := byLayer[l.Digest.String()]
			if !ok {
				return deny(ReasonScanIncomplete, fmt.Sprintf("the scan attestation by %s does not report layer %s (%s)", s.by, l.Digest, l.Path)), nil
			}
			path := l.Path
			if path == "" {
				path = sf.Path
			}
			if why := r.scanRefusal(repo, d.DigestStr(), path, sf.report()); why != "" {
				return verdict{reason: fmt.Sprintf("the scan attestation by %s says %s", s.by, why), unsafe: true}, nil
			}
		}
	}
	by := make([]string, 0, len(found))
	for _, s := range found {
		by = append(by, s.by)
	}
	return verdict{authority: "scan attestation by " + strings.Join(by, ", ")}, nil
}

// classicAttestations reads the attestations stored in the .att tag (none when the tag is absent).
func classicAttestations(tag name.Tag, c client) ([]oci.Signature, error) {
	sigs, err := ociremote.Signatures(tag, c.oci...)
	if err != nil {
		return nil, fmt.Errorf("reading attestations %s: %w", tag, err)
	}
	list, err := sigs.Get()
	if err != nil {
		return nil, fmt.Errorf("reading attestations %s: %w", tag, err)
	}
	out := make([]oci.Signature, 0, len(list))
	for _, s := range list {
		cp, err := static.Copy(s)
		if err != nil {
			return nil, fmt.Errorf("reading attestations %s: %w", tag, err)
		}
		out = append(out, cp)
	}
	return out, nil
}

// checkClassicAttestation verifies one DSSE attestation from the .att tag against one key and returns its
// statement. The cheap checks run first only to tell the reasons apart; cosign's VerifyImageAttestation, with
// its in-toto subject check, is the verification that counts.
func checkClassicAttestation(ctx context.Context, a *authority, att oci.Signature, h v1.Hash, c client) ([]byte, *failure) {
	env, err := att.Payload()
	if err != nil {
		return nil, &failure{ReasonInvalid, err.Error()}
	}
	if err := dsse.WrapVerifier(a.verifier).VerifySignature(bytes.NewReader(env), nil); err != nil {
		return nil, &failure{ReasonWrongKey, fmt.Sprintf("an attestation does not verify with %s (made with another key, or altered after signing)", a.desc)}
	}
	var e struct {
		PayloadType string `json:"payloadType"`
		Payload     string `json:"payload"`
	}
	if err := json.Unmarshal(env, &e); err != nil {
		return nil, &failure{ReasonInvalid, "an attestation is not a DSSE envelope"}
	}
	st, err := base64.StdEncoding.DecodeString(e.Payload)
	if err != nil {
		return nil, &failure{ReasonInvalid, "an attestation's payload is not base64"}
	}
	var head struct {
		PredicateType string `json:"predicateType"`
		Subject       []struct {
			Digest map[string]string `json:"digest"`
		} `json:"subject"`
	}
	if err := json.Unmarshal(st, &head); err != nil {
		return nil, &failure{ReasonInvalid, "an attestation's payload is not an in-toto statement"}
	}
	if head.PredicateType != ScanPredicateType {
		return nil, &failure{ReasonInvalid, fmt.Sprintf("an attestation by %s is of %q, not a scan attestation", a.desc, head.PredicateType)}
	}
	one, err := mutate.AppendSignatures(empty.Signatures(), false, att)
	if err != nil {
		return nil, &failure{ReasonInvalid, err.Error()}
	}
	co := a.co
	co.RegistryClientOpts = c.oci
	co.ClaimVerifier = cosign.IntotoSubjectClaimVerifier
	if _, _, err := cosign.VerifyImageAttestation(ctx, one, h, &co); err != nil {
		var named []string
		for _, s := range head.Subject {
			for algo, hex := range s.Digest {
				named = append(named, algo+":"+hex)
			}
		}
		if !strings.Contains(strings.Join(named, " "), h.String()) {
			return nil, &failure{ReasonOtherDigest, fmt.Sprintf("a scan attestation by %s is about %s, not %s", a.desc, strings.Join(named, ", "), h)}
		}
		if !co.IgnoreTlog {
			noLog := co
			noLog.IgnoreTlog = true
			if _, _, err2 := cosign.VerifyImageAttestation(ctx, one, h, &noLog); err2 == nil {
				return nil, &failure{ReasonTlog, "no transparency-log entry verifiable offline with the trust root's Rekor keys: " + err.Error()}
			}
		}
		return nil, &failure{ReasonInvalid, err.Error()}
	}
	return st, nil
}

// manifestLayers reads d's manifest and its layers; fault says why a scan report cannot be matched to them.
func manifestLayers(d name.Digest, c client) ([]artifact.Layer, string, error) {
	desc, err := remote.Get(d, c.remote...)
	if err != nil {
		return nil, "", fmt.Errorf("reading the manifest %s: %w", d, err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(desc.Manifest, &m); err != nil || desc.MediaType.IsIndex() {
		return nil, fmt.Sprintf("%s: %s is %s, not one artifact's manifest: name the platform's manifest by digest", ReasonUncheckable, d.DigestStr(), desc.MediaType), nil
	}
	layers, err := artifact.Layers(m)
	if err != nil {
		return nil, fmt.Sprintf("%s: %v", ReasonUncheckable, err), nil
	}
	return layers, "", nil
}
