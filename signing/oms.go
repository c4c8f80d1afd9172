package signing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	ociremote "github.com/sigstore/cosign/v2/pkg/oci/remote"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/signing/oms"
)

// OMSRule requires an OpenSSF Model Signing signature (sigstore/model-transparency's model.sig) over the
// artifact's files, by any one of its signers:
//
//	oms:
//	  keys: [/etc/modelpack/keys/oms.pub]               # model_signing sign key (ECDSA public keys)
//	  certificateChains: [/etc/modelpack/oms-ca.pem]    # model_signing sign certificate (PKI root CAs)
//	  keyless:                                          # model_signing sign sigstore, with the rule's trustRoot
//	  - {issuer: https://accounts.google.com, subject: ml-release@example.com}
//
// The signature travels in the artifact, as the layer of its signature file (model.sig, what `modelpack pack`
// of an OMS-signed directory carries), or beside it, as an OCI referrer of artifact type OMSArtifactType
// (what `modelpack sign --format oms` attaches). Every file the statement lists must be a layer with that
// digest, and every layer but the signature's must be listed.
type OMSRule struct {
	Keys              []string   `yaml:"keys" json:"keys,omitempty"`
	CertificateChains []string   `yaml:"certificateChains" json:"certificateChains,omitempty"`
	Keyless           []Identity `yaml:"keyless" json:"keyless,omitempty"`
	// SignatureFile is the signature's path in the model; model.sig when empty.
	SignatureFile string `yaml:"signatureFile" json:"signatureFile,omitempty"`
}

// OMSArtifactType marks an OCI referrer carrying an OMS signature: its one layer, of type OMSLayerMediaType and
// titled model.sig, holds the bundle byte for byte as model_signing writes the file.
const OMSArtifactType = "application/vnd.modelpack.oms.signature.v1+json"

// OMSLayerMediaType is the type of the referrer's model.sig layer. It must not begin with
// application/vnd.dev.sigstore.bundle: cosign verify lists every referrer of a digest whatever its artifactType,
// takes any whose one layer has such a type for a Sigstore bundle signing the manifest, and then switches to
// bundle mode, so an OMS bundle (whose subjects are the model's files) would hide the classic signature from it.
const OMSLayerMediaType = "application/vnd.modelpack.oms.bundle.v1+json"

type omsRule struct {
	verifiers []oms.Verifier
	sigFile   string
}

func (l *loader) compileOMS(r OMSRule, tr *trustRoot, tlog, sct Check, path string) (*omsRule, error) {
	o := &omsRule{sigFile: oms.SignatureFile}
	if r.SignatureFile != "" {
		if err := checkModelFile(r.SignatureFile); err != nil {
			return nil, fmt.Errorf("%s.signatureFile: %v", path, err)
		}
		o.sigFile = r.SignatureFile
	}
	for i, k := range r.Keys {
		data, err := l.read(k, secretPublicKey)
		if err != nil {
			return nil, fmt.Errorf("%s.keys[%d]: %w", path, i, err)
		}
		v, err := oms.NewKeyVerifier(k, data)
		if err != nil {
			return nil, fmt.Errorf("%s.keys[%d]: %w", path, i, err)
		}
		o.verifiers = append(o.verifiers, v)
	}
	for i, c := range r.CertificateChains {
		data, err := l.file(c)
		if err != nil {
			return nil, fmt.Errorf("%s.certificateChains[%d]: %w", path, i, err)
		}
		v, err := oms.NewChainVerifier(c, data)
		if err != nil {
			return nil, fmt.Errorf("%s.certificateChains[%d]: %w", path, i, err)
		}
		o.verifiers = append(o.verifiers, v)
	}
	for i, id := range r.Keyless {
		if (id.Issuer == "") == (id.IssuerRegExp == "") || (id.Subject == "") == (id.SubjectRegExp == "") {
			return nil, fmt.Errorf("%s.keyless[%d]: set exactly one of issuer and issuerRegExp, and one of subject and subjectRegExp", path, i)
		}
		v, err := oms.NewKeylessVerifier(identityString(id), tr.tm, id.Issuer, id.IssuerRegExp, id.Subject, id.SubjectRegExp,
			oms.KeylessOptions{RequireTlog: tlog == Require, RequireSCT: sct == Require})
		if err != nil {
			return nil, fmt.Errorf("%s.keyless[%d]: %w", path, i, err)
		}
		o.verifiers = append(o.verifiers, v)
	}
	if len(o.verifiers) == 0 {
		return nil, fmt.Errorf("%s: no signer: set keys, certificateChains or keyless", path)
	}
	return o, nil
}

func checkModelFile(p string) error {
	if p == "" || p != path.Clean(p) || path.IsAbs(p) || p == ".." || strings.HasPrefix(p, "../") {
		return fmt.Errorf("%q is not a clean path inside the model", p)
	}
	return nil
}

// Reasons only OMS checks give.
const (
	ReasonModelMismatch = "model does not match its OMS signature"
	ReasonUncheckable   = "content OMS cannot check from the manifest"
)

// omsSignature is one OMS signature found for a digest, and where.
type omsSignature struct {
	where string
	data  []byte
	err   error
	// layer is the signature-file layer's path when the signature came from it: that layer alone is exempt
	// from the statement. A referrer exempts nothing, so a model.sig layer beside it must be signed content.
	layer string
}

// checkOMS finds the digest's OMS signatures (its signature-file layer, then its OMS referrers) and accepts the
// first that one of the rule's signers made and that lists exactly the artifact's files. It reads the manifest
// and the signatures, never a model file: raw layers are named by their file's sha256, which the pull checks.
func checkOMS(ctx context.Context, o *omsRule, d name.Digest, c client) (verdict, error) {
	desc, err := remote.Get(d, c.remote...)
	if err != nil {
		return verdict{}, fmt.Errorf("reading the manifest %s: %w", d, err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(desc.Manifest, &m); err != nil || desc.MediaType.IsIndex() {
		return verdict{reason: fmt.Sprintf("%s: %s is %s, not one artifact's manifest: name the platform's manifest by digest", ReasonUncheckable, d.DigestStr(), desc.MediaType)}, nil
	}
	layers, err := artifact.Layers(m)
	if err != nil {
		return verdict{reason: fmt.Sprintf("%s: %v", ReasonUncheckable, err)}, nil
	}
	var sigs []omsSignature
	for _, l := range layers {
		if l.Format == artifact.FormatRaw && !l.Image && path.Clean(l.Path) == o.sigFile {
			data, err := readBlob(d.Context(), l.Descriptor, c)
			sigs = append(sigs, omsSignature{where: fmt.Sprintf("layer %s (%s)", o.sigFile, l.Digest), data: data, err: err, layer: o.sigFile})
			break
		}
	}
	// The signature the artifact carries is tried first; referrers are listed only when it is absent or fails.
	var f failures
	if by, ok := tryOMS(o, layers, sigs, &f); ok {
		return verdict{authority: by}, nil
	}
	refs, err := omsReferrers(d, c)
	if err != nil {
		return verdict{}, err
	}
	if by, ok := tryOMS(o, layers, refs, &f); ok {
		return verdict{authority: by}, nil
	}
	n := len(sigs) + len(refs)
	if n == 0 {
		return verdict{reason: fmt.Sprintf("%s: no OMS signature: neither a %s layer nor a referrer of type %s for %s", ReasonNoSignature, o.sigFile, OMSArtifactType, d.DigestStr())}, nil
	}
	names := make([]string, len(o.verifiers))
	for i, v := range o.verifiers {
		names[i] = v.String()
	}
	best := *f.best
	return verdict{reason: fmt.Sprintf("%s: %s (%d OMS signature(s) checked against %s)", best.reason, best.detail, n, strings.Join(names, ", "))}, nil
}

// tryOMS returns the first signer of sigs whose statement the layers match, recording every failure in f.
func tryOMS(o *omsRule, layers []artifact.Layer, sigs []omsSignature, f *failures) (string, bool) {
	for _, s := range sigs {
		if s.err != nil {
			f.add(failure{ReasonInvalid, fmt.Sprintf("OMS signature %s: %v", s.where, s.err)})
			continue
		}
		sig, err := oms.Parse(s.data)
		if err != nil {
			f.add(failure{ReasonInvalid, fmt.Sprintf("OMS signature %s: %v", s.where, err)})
			continue
		}
		for _, v := range o.verifiers {
			st, err := sig.Verify(v)
			if err != nil {
				f.add(failure{omsReason(err), fmt.Sprintf("OMS signature %s: %v", s.where, err)})
				continue
			}
			files, err := oms.ArtifactFiles(layers, st.Serialization, s.layer)
			if err == nil {
				err = st.Check(files)
			}
			switch {
			case errors.Is(err, oms.ErrNeedsRehash):
				f.add(failure{ReasonUncheckable, fmt.Sprintf("OMS signature %s by %s: %v", s.where, v, err)})
			case err != nil:
				f.add(failure{ReasonModelMismatch, fmt.Sprintf("%v (OMS signature %s by %s)", err, s.where, v)})
			default:
				return fmt.Sprintf("OMS %s (%s)", v, s.where), true
			}
		}
	}
	return "", false
}

func omsReason(err error) string {
	switch {
	case errors.Is(err, oms.ErrWrongKey):
		return ReasonWrongKey
	case errors.Is(err, oms.ErrUntrusted) && strings.Contains(err.Error(), "wrong identity"):
		return ReasonIdentity
	case errors.Is(err, oms.ErrUntrusted):
		return ReasonUntrusted
	}
	return ReasonInvalid
}

// omsReferrers reads the OMS signatures attached to d (the origin's referrers API or its fallback tag).
func omsReferrers(d name.Digest, c client) ([]omsSignature, error) {
	idx, err := ociremote.Referrers(d, OMSArtifactType, c.oci...)
	if err != nil {
		return nil, fmt.Errorf("listing referrers of %s: %w", d, err)
	}
	var out []omsSignature
	for _, r := range idx.Manifests {
		if r.ArtifactType != OMSArtifactType {
			continue // a registry may ignore the filter; the fallback index always does
		}
		s := omsSignature{where: "referrer " + r.Digest.String()}
		s.data, s.err = readReferrerBundle(d.Context().Digest(r.Digest.String()), c)
		out = append(out, s)
	}
	return out, nil
}

func readReferrerBundle(ref name.Digest, c client) ([]byte, error) {
	desc, err := remote.Get(ref, c.remote...)
	if err != nil {
		return nil, err
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(desc.Manifest, &m); err != nil {
		return nil, err
	}
	for _, l := range m.Layers {
		// Referrers written before OMSLayerMediaType used the bundle's own media type; they still verify here.
		if l.MediaType == OMSLayerMediaType || l.MediaType == oms.BundleMediaType {
			return readBlob(ref.Context(), l, c)
		}
	}
	return nil, fmt.Errorf("no layer of type %s", OMSLayerMediaType)
}

// maxSignatureBlob bounds a signature read into memory (oms.Parse refuses anything larger anyway).
const maxSignatureBlob = 64 << 20

func readBlob(repo name.Repository, desc ocispec.Descriptor, c client) ([]byte, error) {
	if desc.Size > maxSignatureBlob {
		return nil, fmt.Errorf("blob %s: %d bytes, over the %d-byte limit of a signature", desc.Digest, desc.Size, maxSignatureBlob)
	}
	l, err := remote.Layer(repo.Digest(desc.Digest.String()), c.remote...)
	if err != nil {
		return nil, err
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", desc.Digest, err)
	}
	defer rc.Close()
	data, err := cas.ReadAll(rc, desc.Digest, desc.Size)
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", desc.Digest, err)
	}
	return data, nil
}

// SignOMS signs the files of the artifact ref points at with a cosign private key, as OMS signs a model
// directory (file serialization, sha256: the raw layers' digests, nothing re-read), and attaches the signature
// as a referrer of the manifest (artifact type OMSArtifactType), which leaves the artifact's digest as it is.
// It returns the signed digest reference and the referrer's digest.
func SignOMS(ctx context.Context, ref, keyRef string, opts SignOptions) (signed, referrer string, err error) {
	signer, err := loadOMSSigner(keyRef, opts.SecretsDir, opts.Password)
	if err != nil {
		return "", "", err
	}
	c := writeClient(ctx, opts.Registry, ref)
	d, err := resolve(ref, c)
	if err != nil {
		return "", "", fmt.Errorf("sign: %w", err)
	}
	desc, err := remote.Get(d, c.remote...)
	if err != nil {
		return "", "", fmt.Errorf("sign: reading %s: %w", d, err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(desc.Manifest, &m); err != nil || desc.MediaType.IsIndex() {
		return "", "", fmt.Errorf("sign: %s is %s: OMS signs one artifact's files; name a platform's manifest", d, desc.MediaType)
	}
	layers, err := artifact.Layers(m)
	if err != nil {
		return "", "", fmt.Errorf("sign: %w", err)
	}
	// Every layer is signed, a model.sig layer too: a referrer exempts nothing from the statement.
	files, err := oms.ArtifactFiles(layers, oms.Serialization{Method: oms.MethodFiles, HashType: "sha256"}, "")
	if err != nil {
		return "", "", fmt.Errorf("sign: %w", err)
	}
	st, err := oms.NewStatement(path.Base(d.Context().RepositoryStr()), files, oms.DefaultIgnores)
	if err != nil {
		return "", "", fmt.Errorf("sign: %w", err)
	}
	bundle, err := oms.Sign(st, signer)
	if err != nil {
		return "", "", fmt.Errorf("sign: %w", err)
	}
	rd, err := putOMSReferrer(d, desc.Descriptor, bundle, c)
	if err != nil {
		return "", "", fmt.Errorf("sign: attaching the OMS signature to %s: %w", d, err)
	}
	return d.String(), rd, nil
}

// AttachOMS attaches an OMS signature made elsewhere (model_signing sign over the model's directory: its
// model.sig) to the artifact ref points at, as SignOMS attaches its own, after checking that the signature's
// statement lists exactly the artifact's files with their digests, as the node will: a bundle for another model,
// another revision of it, or a subset of its files is refused naming the first file that differs, and nothing
// is written. Who signed it is not checked here (no key is needed): the node's oms rule decides that. It returns
// the signed digest reference and the referrer's digest.
func AttachOMS(ctx context.Context, ref string, bundle []byte, opts SignOptions) (signed, referrer string, err error) {
	sig, err := oms.Parse(bundle)
	if err != nil {
		return "", "", fmt.Errorf("attach: %w", err)
	}
	c := writeClient(ctx, opts.Registry, ref)
	d, err := resolve(ref, c)
	if err != nil {
		return "", "", fmt.Errorf("attach: %w", err)
	}
	desc, err := remote.Get(d, c.remote...)
	if err != nil {
		return "", "", fmt.Errorf("attach: reading %s: %w", d, err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(desc.Manifest, &m); err != nil || desc.MediaType.IsIndex() {
		return "", "", fmt.Errorf("attach: %s is %s: an OMS signature covers one artifact's files; name a platform's manifest", d, desc.MediaType)
	}
	layers, err := artifact.Layers(m)
	if err != nil {
		return "", "", fmt.Errorf("attach: %w", err)
	}
	st := sig.UnverifiedStatement()
	// As the node checks a referrer: every layer counts, a model.sig layer too.
	files, err := oms.ArtifactFiles(layers, st.Serialization, "")
	if err == nil {
		err = st.Check(files)
	}
	if err != nil {
		return "", "", fmt.Errorf("attach: the OMS signature does not match %s, refused (nothing written): %w", d, err)
	}
	rd, err := putOMSReferrer(d, desc.Descriptor, bundle, c)
	if err != nil {
		return "", "", fmt.Errorf("attach: attaching the OMS signature to %s: %w", d, err)
	}
	return d.String(), rd, nil
}

// putOMSReferrer pushes the bundle and a manifest whose subject is the signed manifest; go-containerregistry
// updates the referrers fallback tag on registries without the referrers API.
func putOMSReferrer(d name.Digest, subject v1.Descriptor, bundle []byte, c client) (string, error) {
	layer := static.NewLayer(bundle, types.MediaType(OMSLayerMediaType))
	empty := static.NewLayer([]byte("{}"), types.MediaType(ocispec.MediaTypeEmptyJSON))
	for _, l := range []v1.Layer{layer, empty} {
		if err := remote.WriteLayer(d.Repository, l, c.remote...); err != nil {
			return "", err
		}
	}
	m := ocispec.Manifest{
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: OMSArtifactType,
		Config:       ocispec.Descriptor{MediaType: ocispec.MediaTypeEmptyJSON, Digest: digest.FromBytes([]byte("{}")), Size: 2, Data: []byte("{}")},
		Layers: []ocispec.Descriptor{{
			MediaType: OMSLayerMediaType, Digest: digest.FromBytes(bundle), Size: int64(len(bundle)),
			Annotations: map[string]string{ocispec.AnnotationTitle: oms.SignatureFile},
		}},
		Subject: &ocispec.Descriptor{MediaType: string(subject.MediaType), Digest: digest.Digest(subject.Digest.String()), Size: subject.Size},
	}
	m.SchemaVersion = 2
	raw, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	rd := digest.FromBytes(raw)
	if err := remote.Put(d.Context().Digest(rd.String()), rawManifest(raw), c.remote...); err != nil {
		return "", err
	}
	return rd.String(), nil
}

// rawManifest is a manifest go-containerregistry pushes byte for byte.
type rawManifest []byte

func (r rawManifest) RawManifest() ([]byte, error) { return bytes.Clone(r), nil }

// MediaType is the Content-Type go-containerregistry sends (it assumes a Docker manifest otherwise).
func (r rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// OMSVerifier compiles the oms section of r (with r's trust root and log settings) into one verifier for
// checking a model directory: `modelpack verify --oms DIR`.
func OMSVerifier(r Rule) (oms.Verifier, string, error) {
	if r.OMS == nil {
		return nil, "", errors.New("no OMS signer given")
	}
	l := &loader{secretsDir: secretsDirFromEnv()}
	cr, err := l.compileRule(r, "command line")
	if err != nil {
		return nil, "", err
	}
	return oms.AnyOf(cr.oms.verifiers), cr.oms.sigFile, nil
}

// SignOMSDir signs a model directory as `model_signing sign key` does, with a cosign private key: every file
// (but the signature and DefaultIgnores) by sha256, the bundle written to sigPath (DIR/model.sig when empty).
func SignOMSDir(dir, sigPath, keyRef string, opts SignOptions) (*oms.Statement, string, error) {
	signer, err := loadOMSSigner(keyRef, opts.SecretsDir, opts.Password)
	if err != nil {
		return nil, "", err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, "", err
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		return nil, "", fmt.Errorf("%s: not a model directory", dir)
	}
	if sigPath == "" {
		sigPath = filepath.Join(dir, oms.SignatureFile)
	}
	ignore := append([]string{}, oms.DefaultIgnores...)
	if absSig, err := filepath.Abs(sigPath); err == nil {
		if rel, err := filepath.Rel(abs, absSig); err == nil && !strings.HasPrefix(rel, "..") {
			ignore = append([]string{filepath.ToSlash(rel)}, ignore...)
		}
	}
	files, err := oms.HashDir(abs, oms.Serialization{Method: oms.MethodFiles, HashType: "sha256"}, ignore)
	if err != nil {
		return nil, "", err
	}
	st, err := oms.NewStatement(filepath.Base(abs), files, ignore)
	if err != nil {
		return nil, "", err
	}
	bundle, err := oms.Sign(st, signer)
	if err != nil {
		return nil, "", err
	}
	// Written aside and renamed: a signature file is whole or absent.
	tmp, err := os.CreateTemp(filepath.Dir(sigPath), ".model.sig-*")
	if err != nil {
		return nil, "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(bundle); err != nil {
		tmp.Close()
		return nil, "", err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return nil, "", err
	}
	if err := tmp.Close(); err != nil {
		return nil, "", err
	}
	return st, sigPath, os.Rename(tmp.Name(), sigPath)
}
