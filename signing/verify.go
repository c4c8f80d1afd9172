package signing

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sigstore/cosign/v2/pkg/cosign"
	"github.com/sigstore/cosign/v2/pkg/oci"
	ociremote "github.com/sigstore/cosign/v2/pkg/oci/remote"
	"github.com/sigstore/cosign/v2/pkg/oci/static"
	"github.com/sigstore/cosign/v2/pkg/types"
	sgbundle "github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/verify"
	"github.com/sigstore/sigstore/pkg/signature/options"
	"github.com/sigstore/sigstore/pkg/signature/payload"
	"golang.org/x/sync/singleflight"

	mpremote "github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/internal/errdef"
)

// ErrDenied is wrapped by every refusal of an enforce rule; the error text names the rule and the reason. It is
// the driver's ErrDenied too, so a refusal reaches kubelet as PERMISSION_DENIED without a translation.
var ErrDenied = errdef.ErrDenied

// Reasons a signature check fails, most specific first.
const (
	ReasonNoSignature = "no signature"
	ReasonOtherDigest = "signature for another digest"
	ReasonIdentity    = "wrong identity"
	ReasonUntrusted   = "untrusted certificate"
	ReasonTlog        = "transparency log"
	ReasonWrongKey    = "wrong key"
	ReasonInvalid     = "invalid signature"
)

// Decision is the verdict on one digest.
type Decision struct {
	Ref       string `json:"ref"`
	Rule      string `json:"rule"`
	Mode      Mode   `json:"mode"`
	Verified  bool   `json:"verified"`
	Authority string `json:"authority,omitempty"` // the key or identity that verified it
	Reason    string `json:"reason,omitempty"`    // why it is not verified
	// Namespace is the pod's namespace the rule was chosen for ("" for none: unscoped rules only).
	Namespace string `json:"namespace,omitempty"`
}

// How long verdicts stay cached. Denials expire quickly so a signature added after a refusal takes effect on
// the next retry without hammering the registry; a policy change invalidates everything at once.
const (
	verifiedTTL = time.Hour
	deniedTTL   = 30 * time.Second
	maxCached   = 4096
	// checkTimeout bounds one signature check, which reads a few small manifests and blobs.
	checkTimeout = 5 * time.Minute
)

// Verifier checks digests against the current policy.
type Verifier struct {
	// Log receives warn-mode failures, refusals and policy reloads; slog.Default() when nil.
	Log *slog.Logger

	reg     *mpremote.Transports
	policy  atomic.Pointer[Policy]
	flight  singleflight.Group
	results *prometheus.CounterVec

	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	v       verdict
	expires time.Time
}

// verdict is the policy-independent outcome of checking signatures: verified by an authority, or denied.
type verdict struct {
	authority string
	reason    string // set when denied
	// unsafe marks a denial of the content rather than of its signer (a scan attestation missing, or reporting
	// code): it wraps ErrUnsafeContent, FAILED_PRECONDITION at the driver, like the node's own scan.
	unsafe bool
}

// NewVerifier returns a verifier for p reaching registries through reg: signatures are read as the model is.
func NewVerifier(p *Policy, reg *mpremote.Transports) *Verifier {
	v := &Verifier{
		reg:   reg,
		cache: map[string]cached{},
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "modelpack_signature_verifications_total",
			Help: "Signature policy decisions by result: verified, denied, warned (failed under a warn rule), skipped (mode off or none) or error (registry unreachable).",
		}, []string{"result"}),
	}
	for _, r := range []string{"verified", "denied", "warned", "skipped", "error"} {
		v.results.WithLabelValues(r)
	}
	v.policy.Store(p)
	return v
}

// Collector exposes the verification counter for the caller's Prometheus registry.
func (v *Verifier) Collector() prometheus.Collector { return v.results }

// Policy is the policy in force.
func (v *Verifier) Policy() *Policy { return v.policy.Load() }

// SetPolicy replaces the policy; cached verdicts of the old one no longer apply.
func (v *Verifier) SetPolicy(p *Policy) {
	v.policy.Store(p)
	v.mu.Lock()
	v.cache = map[string]cached{}
	v.mu.Unlock()
}

func (v *Verifier) log() *slog.Logger {
	if v.Log != nil {
		return v.Log
	}
	return slog.Default()
}

// Verify decides whether the manifest digest ref (repo@sha256:…, never a tag: resolve it once, verify, then
// pull exactly that digest) may be used. Under an enforce rule a failed check returns an error wrapping
// ErrDenied; under warn it is logged and allowed. Other errors (registry unreachable) are not cached.
func (v *Verifier) Verify(ctx context.Context, ref string) (Decision, error) {
	return v.verify(ctx, "", ref)
}

func (v *Verifier) verify(ctx context.Context, namespace, ref string) (Decision, error) {
	d, err := name.NewDigest(ref)
	if err != nil {
		return Decision{Ref: ref}, fmt.Errorf("signature policy: %q is not a digest reference (repo@sha256:…): %w", ref, err)
	}
	p := v.Policy()
	r := p.ruleIn(namespace, repoKey(d.Context()))
	dec := Decision{Ref: d.String(), Rule: r.name, Mode: r.mode, Namespace: namespace}
	switch {
	case r.mode == Off:
		dec.Reason = "rule mode is off"
		v.results.WithLabelValues("skipped").Inc()
		return dec, nil
	case r.none:
		dec.Reason = "rule requires no signature"
		v.results.WithLabelValues("skipped").Inc()
		return dec, nil
	}
	vd, err := v.verdict(ctx, p, r, d)
	switch {
	case err != nil && r.mode == Warn:
		dec.Reason = err.Error()
		v.results.WithLabelValues("warned").Inc()
		v.log().Warn("signature check failed, allowed by a warn rule", "ref", dec.Ref, "rule", r.name, "err", err)
		return dec, nil
	case err != nil:
		v.results.WithLabelValues("error").Inc()
		return dec, fmt.Errorf("signature policy: checking %s: %w", dec.Ref, err)
	case vd.reason == "":
		dec.Verified, dec.Authority = true, vd.authority
		v.results.WithLabelValues("verified").Inc()
		return dec, nil
	}
	dec.Reason = vd.reason
	if r.mode == Warn {
		v.results.WithLabelValues("warned").Inc()
		v.log().Warn("signature policy would deny, allowed by a warn rule", "ref", dec.Ref, "rule", r.name, "reason", vd.reason)
		return dec, nil
	}
	v.results.WithLabelValues("denied").Inc()
	v.log().Info("signature policy denied", "ref", dec.Ref, "rule", r.name, "reason", vd.reason)
	sentinel := ErrDenied
	if vd.unsafe {
		sentinel = ErrUnsafeContent
	}
	return dec, fmt.Errorf("%w: %s: rule %q: %s", sentinel, dec.Ref, r.name, vd.reason)
}

// verdict checks signatures once per digest and policy version: concurrent callers share one check and
// later ones get the cached verdict.
func (v *Verifier) verdict(ctx context.Context, p *Policy, r *rule, d name.Digest) (verdict, error) {
	// Rules differ by namespace for one digest: the verdict is the rule's (names are unique within a policy).
	key := p.Version() + " " + r.name + " " + d.String()
	now := time.Now()
	v.mu.Lock()
	c, ok := v.cache[key]
	v.mu.Unlock()
	if ok && now.Before(c.expires) {
		return c.v, nil
	}
	// The check outlives a caller whose deadline passes (kubelet gives a CSI call about two minutes): the retry
	// joins it instead of starting over. checkTimeout bounds it instead.
	ch := v.flight.DoChan(key, func() (any, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkTimeout)
		defer cancel()
		vd, err := v.check(cctx, r, d)
		if err != nil {
			return vd, err
		}
		ttl := verifiedTTL
		if vd.reason != "" {
			ttl = deniedTTL
		}
		v.mu.Lock()
		if len(v.cache) >= maxCached {
			for k, e := range v.cache {
				if now.After(e.expires) {
					delete(v.cache, k)
				}
			}
			if len(v.cache) >= maxCached {
				v.cache = map[string]cached{}
			}
		}
		if p == v.policy.Load() {
			v.cache[key] = cached{v: vd, expires: time.Now().Add(ttl)}
		}
		v.mu.Unlock()
		return vd, nil
	})
	select {
	case res := <-ch:
		return res.Val.(verdict), res.Err
	case <-ctx.Done():
		return verdict{}, ctx.Err()
	}
}

// check applies every requirement of the rule: cosign signatures when it names keys or keyless identities, an
// OMS signature over the model's files when it has an oms section, and a scan attestation when it has a
// scanAttestation section.
func (v *Verifier) check(ctx context.Context, r *rule, d name.Digest) (verdict, error) {
	c := readClient(ctx, v.reg, d.String())
	var by []string
	if len(r.authorities) > 0 {
		vd, err := v.checkCosign(ctx, r, d, c)
		if err != nil || vd.reason != "" {
			return vd, err
		}
		by = append(by, vd.authority)
	}
	if r.oms != nil {
		vd, err := checkOMS(ctx, r.oms, d, c)
		if err != nil || vd.reason != "" {
			return vd, err
		}
		by = append(by, vd.authority)
	}
	if len(r.scanners) > 0 {
		vd, err := checkScanAttestation(ctx, r, d, c)
		if err != nil || vd.reason != "" {
			return vd, err
		}
		by = append(by, vd.authority)
	}
	return verdict{authority: strings.Join(by, " and ")}, nil
}

// checkCosign fetches the digest's cosign signatures (the .sig tag) and, failing those, its Sigstore bundles
// (referrers), and tries every authority of the rule on each. It never reads the artifact's own blobs.
func (v *Verifier) checkCosign(ctx context.Context, r *rule, d name.Digest, c client) (verdict, error) {
	h, err := v1.NewHash(d.DigestStr())
	if err != nil {
		return verdict{}, err
	}
	var f failures
	sigs, err := classicSignatures(d, c)
	if err != nil {
		return verdict{}, err
	}
	for _, sig := range sigs {
		for _, a := range r.authorities {
			if fail := checkClassic(ctx, a, sig, h, c); fail == nil {
				return verdict{authority: a.desc}, nil
			} else {
				f.add(*fail)
			}
		}
	}
	bundles, err := sigstoreBundles(d, c)
	if err != nil {
		return verdict{}, err
	}
	for _, b := range bundles {
		if b.err != nil {
			f.add(failure{ReasonInvalid, fmt.Sprintf("bundle %s: %v", b.digest, b.err)})
			continue
		}
		for _, a := range r.authorities {
			if fail := checkBundle(ctx, a, b.bundle, h); fail == nil {
				return verdict{authority: a.desc + " (Sigstore bundle)"}, nil
			} else {
				f.add(*fail)
			}
		}
	}
	if len(sigs) == 0 && len(bundles) == 0 {
		tag, _ := ociremote.SignatureTag(d, c.oci...)
		return verdict{reason: fmt.Sprintf("%s: neither a cosign signature (%s) nor a Sigstore bundle referrer for %s", ReasonNoSignature, tag.TagStr(), d.DigestStr())}, nil
	}
	return verdict{reason: f.reason(len(sigs)+len(bundles), r.authorities)}, nil
}

func classicSignatures(d name.Digest, c client) ([]oci.Signature, error) {
	tag, err := ociremote.SignatureTag(d, c.oci...)
	if err != nil {
		return nil, err
	}
	sigs, err := ociremote.Signatures(tag, c.oci...)
	if err != nil {
		return nil, fmt.Errorf("reading signatures %s: %w", tag, err)
	}
	list, err := sigs.Get()
	if err != nil {
		return nil, fmt.Errorf("reading signatures %s: %w", tag, err)
	}
	out := make([]oci.Signature, 0, len(list))
	for _, s := range list {
		// A remote signature reads its payload blob on every call; each is checked once per authority.
		cp, err := static.Copy(s)
		if err != nil {
			return nil, fmt.Errorf("reading signatures %s: %w", tag, err)
		}
		out = append(out, cp)
	}
	return out, nil
}

type fetchedBundle struct {
	digest string
	bundle *sgbundle.Bundle
	err    error
}

const (
	bundleArtifactTypePrefix = "application/vnd.dev.sigstore.bundle"
	emptyConfigMediaType     = "application/vnd.oci.empty.v1+json"
)

func sigstoreBundles(d name.Digest, c client) ([]fetchedBundle, error) {
	idx, err := ociremote.Referrers(d, "", c.oci...)
	if err != nil {
		return nil, fmt.Errorf("listing referrers of %s: %w", d, err)
	}
	var out []fetchedBundle
	for _, m := range idx.Manifests {
		advertised := strings.HasPrefix(m.ArtifactType, bundleArtifactTypePrefix)
		// The referrers-tag fallback index go-containerregistry writes (registries without the referrers API,
		// such as distribution 3.1) records the config media type, the empty config, instead of the artifact
		// type: such entries are looked at, and skipped if they turn out not to be bundles.
		if !advertised && m.ArtifactType != "" && m.ArtifactType != emptyConfigMediaType {
			continue
		}
		b, err := ociremote.Bundle(d.Context().Digest(m.Digest.String()), c.oci...)
		if err != nil && !advertised {
			continue
		}
		out = append(out, fetchedBundle{digest: m.Digest.String(), bundle: b, err: err})
	}
	return out, nil
}

// checkClassic verifies one simple-signing signature against one authority. The cheap checks run first only to
// tell the reasons apart; cosign's VerifyImageSignature is the verification that counts.
func checkClassic(ctx context.Context, a *authority, sig oci.Signature, h v1.Hash, c client) *failure {
	co := a.co
	co.RegistryClientOpts = c.oci
	if a.keyless {
		cert, err := sig.Cert()
		if err != nil || cert == nil {
			return &failure{ReasonIdentity, "a signature carries no certificate (it was made with a key, not keyless)"}
		}
		if err := cosign.CheckCertificatePolicy(cert, &co); err != nil {
			return &failure{ReasonIdentity, err.Error()}
		}
	} else {
		b64, err := sig.Base64Signature()
		if err != nil {
			return &failure{ReasonInvalid, err.Error()}
		}
		raw, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return &failure{ReasonInvalid, "signature is not base64"}
		}
		pl, err := sig.Payload()
		if err != nil {
			return &failure{ReasonInvalid, err.Error()}
		}
		if err := a.verifier.VerifySignature(bytes.NewReader(raw), bytes.NewReader(pl), options.WithContext(ctx)); err != nil {
			return &failure{ReasonWrongKey, "made with another key"}
		}
	}
	if _, err := cosign.VerifyImageSignature(ctx, sig, h, &co); err != nil {
		if !co.IgnoreTlog {
			// Only the log check can tell the two apart: the signature holds up without it.
			noLog := co
			noLog.IgnoreTlog = true
			if _, err2 := cosign.VerifyImageSignature(ctx, sig, h, &noLog); err2 == nil {
				return &failure{ReasonTlog, "no transparency-log entry verifiable offline with the trust root's Rekor keys: " + err.Error()}
			}
		}
		msg, _, _ := strings.Cut(err.Error(), ". Check your TUF root") // cosign's hint is about its public-good root
		if a.keyless {
			return &failure{ReasonUntrusted, msg}
		}
		return &failure{ReasonInvalid, msg}
	}
	if err := cosign.SimpleClaimVerifier(sig, h, nil); err != nil {
		return &failure{ReasonOtherDigest, fmt.Sprintf("a signature by %s names %s, not %s", a.desc, claimedDigest(sig), h)}
	}
	return nil
}

func claimedDigest(sig oci.Signature) string {
	pl, err := sig.Payload()
	if err != nil {
		return "an unreadable payload"
	}
	var sci payload.SimpleContainerImage
	if json.Unmarshal(pl, &sci) != nil || sci.Critical.Image.DockerManifestDigest == "" {
		return "no digest"
	}
	return sci.Critical.Image.DockerManifestDigest
}

// checkBundle verifies one Sigstore bundle (cosign v3's default) against one authority with sigstore-go. A DSSE
// bundle must carry cosign's signature predicate: other attestations by the same signer are not signatures.
func checkBundle(ctx context.Context, a *authority, b *sgbundle.Bundle, h v1.Hash) *failure {
	return checkBundleOf(ctx, a, b, h, types.CosignSignPredicateType, "a cosign signature")
}

// checkBundleOf verifies a bundle against one authority and requires its DSSE statement to be of predicateType
// (what names it in messages). Only cosign signatures may be message-signature bundles.
func checkBundleOf(ctx context.Context, a *authority, b *sgbundle.Bundle, h v1.Hash, predicateType, what string) *failure {
	co := a.bundleCO
	want, err := hex.DecodeString(h.Hex)
	if err != nil {
		return &failure{ReasonInvalid, err.Error()}
	}
	_, err = cosign.VerifyNewBundle(ctx, &co, verify.WithArtifactDigest(h.Algorithm, want), b)
	if err == nil {
		env := b.GetDsseEnvelope()
		if env == nil {
			if predicateType == types.CosignSignPredicateType {
				return nil
			}
			return &failure{ReasonInvalid, fmt.Sprintf("a bundle by %s is a message signature, not %s", a.desc, what)}
		}
		var st struct {
			PredicateType string `json:"predicateType"`
		}
		if json.Unmarshal(env.GetPayload(), &st) != nil || st.PredicateType != predicateType {
			return &failure{ReasonInvalid, fmt.Sprintf("a bundle by %s is an attestation of %q, not %s", a.desc, st.PredicateType, what)}
		}
		return nil
	}
	if _, err2 := cosign.VerifyNewBundle(ctx, &co, verify.WithoutArtifactUnsafe(), b); err2 == nil {
		return &failure{ReasonOtherDigest, fmt.Sprintf("a bundle by %s is for another artifact: %v", a.desc, err)}
	}
	var idErr *verify.ErrNoMatchingCertificateIdentity
	switch {
	case errors.As(err, &idErr):
		return &failure{ReasonIdentity, err.Error()}
	case a.keyless:
		return &failure{ReasonUntrusted, err.Error()}
	}
	return &failure{ReasonWrongKey, fmt.Sprintf("no bundle verifies with %s: %v", a.desc, err)}
}

type failure struct {
	reason, detail string
}

// failures keeps the most telling failure: a valid signature for another digest says more than a wrong key.
type failures struct{ best *failure }

var precedence = map[string]int{
	ReasonModelMismatch: 8, ReasonUncheckable: 7, ReasonOtherDigest: 6, ReasonIdentity: 5, ReasonUntrusted: 4, ReasonTlog: 3, ReasonWrongKey: 2, ReasonInvalid: 1,
}

func (f *failures) add(x failure) {
	if f.best == nil || precedence[x.reason] > precedence[f.best.reason] {
		f.best = &x
	}
}

func (f *failures) reason(n int, auth []*authority) string {
	names := make([]string, len(auth))
	for i, a := range auth {
		names[i] = a.desc
	}
	best := failure{ReasonInvalid, "no usable signature"}
	if f.best != nil {
		best = *f.best
	}
	return fmt.Sprintf("%s: %s (%d signature(s) checked against %s)", best.reason, best.detail, n, strings.Join(names, ", "))
}

// repoKey is how policy patterns name a repository: registry/path, with Docker Hub as docker.io.
func repoKey(r name.Repository) string {
	reg := r.RegistryStr()
	if reg == name.DefaultRegistry {
		reg = "docker.io"
	}
	return reg + "/" + r.RepositoryStr()
}
