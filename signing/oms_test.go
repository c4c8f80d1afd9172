package signing

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	gcrremote "github.com/google/go-containerregistry/pkg/v1/remote"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/modelpack/modelpack/signing/oms"
)

const omsVectors = "oms/testdata/vectors"

// pushFiles pushes a ModelPack artifact with one raw layer per file, as `modelpack pack` lays a directory out.
func pushFiles(t *testing.T, host, repo, tag string, files map[string][]byte) string {
	t.Helper()
	ctx := context.Background()
	store := memory.New()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var layers []ocispec.Descriptor
	var diffIDs []string
	for _, n := range names {
		b := files[n]
		mt := "application/vnd.cncf.model.weight.v1.raw"
		if n == "model.sig" {
			mt = "application/vnd.cncf.model.doc.v1.raw"
		}
		l := ocispec.Descriptor{MediaType: mt, Digest: digestOf(b), Size: int64(len(b)),
			Annotations: map[string]string{"org.cncf.model.filepath": n, ocispec.AnnotationTitle: n}}
		if err := store.Push(ctx, l, bytes.NewReader(b)); err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Fatal(err)
		}
		layers = append(layers, l)
		diffIDs = append(diffIDs, `"`+l.Digest.String()+`"`)
	}
	cfg := []byte(`{"descriptor":{"name":"` + repo + `"},"config":{},"modelfs":{"type":"layers","diffIds":[` + strings.Join(diffIDs, ",") + `]}}`)
	cfgDesc := ocispec.Descriptor{MediaType: "application/vnd.cncf.model.config.v1+json", Digest: digestOf(cfg), Size: int64(len(cfg))}
	if err := store.Push(ctx, cfgDesc, bytes.NewReader(cfg)); err != nil {
		t.Fatal(err)
	}
	m, err := oras.PackManifest(ctx, store, oras.PackManifestVersion1_1, "application/vnd.cncf.model.manifest.v1+json",
		oras.PackManifestOptions{Layers: layers, ConfigDescriptor: &cfgDesc})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Tag(ctx, m, tag); err != nil {
		t.Fatal(err)
	}
	dst, err := remote.NewRepository(host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	dst.PlainHTTP = true
	if _, err := oras.Copy(ctx, store, tag, dst, tag, oras.DefaultCopyOptions); err != nil {
		t.Fatal(err)
	}
	return host + "/" + repo + "@" + m.Digest.String()
}

// vectorFiles reads a reference vector folder as a map of its files.
func vectorFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	ents, err := os.ReadDir(filepath.Join(omsVectors, dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(omsVectors, dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

func omsPolicy(t *testing.T, o OMSRule) *Policy {
	t.Helper()
	p, err := NewPolicy(PolicyFile{Default: Rule{Name: "oms-models", Mode: Enforce, OMS: &o}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestVerifyOMSLayer: a model packed with the model.sig the reference implementation wrote beside it verifies
// from its manifest alone; a layer changed, added or removed, or another signer, is refused naming the file.
func TestVerifyOMSLayer(t *testing.T) {
	host := startRegistry(t)
	ctx := context.Background()
	keyPol := omsPolicy(t, OMSRule{Keys: []string{filepath.Join(omsVectors, "keys/signing-key-pub.pem")}})
	chainPol := omsPolicy(t, OMSRule{CertificateChains: []string{filepath.Join(omsVectors, "keys/ca-cert.pem")}})

	good := vectorFiles(t, "v1.0.0-certificate")
	ref := pushFiles(t, host, "oms/good", "v1", good)
	for name, p := range map[string]*Policy{"key": keyPol, "chain": chainPol} {
		tr := &countingTransport{}
		dec, err := NewVerifier(p, transports(t, tr.options())).Verify(ctx, ref)
		if err != nil || !dec.Verified || !strings.Contains(dec.Authority, "layer model.sig") {
			t.Fatalf("%s: a reference-signed model: %+v, %v", name, dec, err)
		}
		// The check reads the manifest, the signature and the referrers, never a model file.
		paths := tr.reset()
		for _, f := range []string{"signme-1", "signme-2"} {
			if tr.paths = paths; tr.contains(digestOf(good[f]).String()) {
				t.Fatalf("%s: the OMS check read the model file %s: %v", name, f, paths)
			}
		}
		if tr.paths = paths; !tr.contains("/blobs/" + digestOf(good["model.sig"]).String()) {
			t.Fatalf("%s: the signature blob was not read: %v", name, paths)
		}
		t.Logf("%s: %d requests: %v", name, len(paths), paths)
	}

	tampered := vectorFiles(t, "v1.0.0-certificate")
	tampered["signme-1"] = append([]byte{}, tampered["signme-1"]...)
	tampered["signme-1"][0] ^= 1
	added := vectorFiles(t, "v1.0.0-certificate")
	added["extra.safetensors"] = []byte("unsigned weights")
	removed := vectorFiles(t, "v1.0.0-certificate")
	delete(removed, "signme-2")
	for _, c := range []struct {
		name  string
		files map[string][]byte
		want  string
	}{
		{"tampered", tampered, `file "signme-1" has digest`},
		{"added", added, `file "extra.safetensors" is not listed`},
		{"removed", removed, `file "signme-2" is signed but missing`},
	} {
		ref := pushFiles(t, host, "oms/"+c.name, "v1", c.files)
		dec, err := NewVerifier(chainPol, plainTransports(t)).Verify(ctx, ref)
		wantDenied(t, dec, err, ReasonModelMismatch)
		if !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v does not name the file (%s)", c.name, err, c.want)
		}
	}

	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	otherPub := writePub(t, t.TempDir(), "other.pub", &other.PublicKey)
	dec, err := NewVerifier(omsPolicy(t, OMSRule{Keys: []string{otherPub}}), plainTransports(t)).Verify(ctx, ref)
	wantDenied(t, dec, err, ReasonWrongKey)

	// Keyless: the reference's Sigstore-signed vector, against Sigstore's public-good trust root as a file.
	keyless := pushFiles(t, host, "oms/keyless", "v1", vectorFiles(t, "v1.0.0-sigstore"))
	kp, err := NewPolicy(PolicyFile{Default: Rule{Name: "oms-keyless", TrustRoot: TrustRoot{TrustedRoot: "oms/testdata/public-good-trusted_root.json"},
		OMS: &OMSRule{Keyless: []Identity{{Issuer: "https://sigstore.verify.ibm.com/oauth2", Subject: "stefanb@us.ibm.com"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if dec, err := NewVerifier(kp, plainTransports(t)).Verify(ctx, keyless); err != nil || !dec.Verified {
		t.Fatalf("keyless vector: %+v, %v", dec, err)
	}
	kp, err = NewPolicy(PolicyFile{Default: Rule{Name: "oms-keyless", TrustRoot: TrustRoot{TrustedRoot: "oms/testdata/public-good-trusted_root.json"},
		OMS: &OMSRule{Keyless: []Identity{{Issuer: "https://sigstore.verify.ibm.com/oauth2", Subject: "mallory@example.com"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	dec, err = NewVerifier(kp, plainTransports(t)).Verify(ctx, keyless)
	wantDenied(t, dec, err, ReasonIdentity)

	unsigned := vectorFiles(t, "v1.0.0-certificate")
	delete(unsigned, "model.sig")
	dec, err = NewVerifier(keyPol, plainTransports(t)).Verify(ctx, pushFiles(t, host, "oms/unsigned", "v1", unsigned))
	wantDenied(t, dec, err, ReasonNoSignature)
}

// TestSignOMS: modelpack's OMS signature of a registry artifact travels as a referrer, verifies with the cosign
// public key, leaves the artifact's digest alone, and is no cosign signature.
func TestSignOMS(t *testing.T) {
	host := startRegistry(t)
	ctx := context.Background()
	dir := t.TempDir()
	key, pub := newKeys(t, dir, "cosign")
	ref := pushFiles(t, host, "oms/signed", "v1", map[string][]byte{"model.safetensors": []byte("weights"), "config.json": []byte("{}")})
	signed, referrer, err := SignOMS(ctx, ref, key, SignOptions{Password: testPass, Registry: plainTransports(t)})
	if err != nil {
		t.Fatal(err)
	}
	if signed != ref || referrer == "" {
		t.Fatalf("signed %s (want %s), referrer %q", signed, ref, referrer)
	}
	dec, err := NewVerifier(omsPolicy(t, OMSRule{Keys: []string{pub}}), plainTransports(t)).Verify(ctx, ref)
	if err != nil || !dec.Verified || !strings.Contains(dec.Authority, "referrer "+referrer) {
		t.Fatalf("modelpack's OMS signature: %+v, %v", dec, err)
	}
	// An OMS signature says nothing about the manifest digest: a cosign rule still finds no signature.
	dec, err = NewVerifier(keyPolicy(t, Enforce, pub), plainTransports(t)).Verify(ctx, ref)
	wantDenied(t, dec, err, ReasonNoSignature)
	// A rule asking for both is met once the cosign signature is there too.
	sign(t, ref, key)
	p, err := NewPolicy(PolicyFile{Default: Rule{Keys: []string{pub}, TransparencyLog: Waive, OMS: &OMSRule{Keys: []string{pub}}}})
	if err != nil {
		t.Fatal(err)
	}
	dec, err = NewVerifier(p, plainTransports(t)).Verify(ctx, ref)
	if err != nil || !dec.Verified || !strings.Contains(dec.Authority, " and OMS key") {
		t.Fatalf("cosign and OMS: %+v, %v", dec, err)
	}
}

func TestOMSPolicyErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		rule OMSRule
		want string
	}{
		{"no signer", OMSRule{}, "default.oms: no signer"},
		{"not a key", OMSRule{Keys: []string{filepath.Join(omsVectors, "keys/ca-cert.pem")}}, "default.oms.keys[0]"},
		{"no root", OMSRule{CertificateChains: []string{filepath.Join(omsVectors, "keys/signing-key-pub.pem")}}, "no self-signed root"},
		{"keyless without trust root", OMSRule{Keyless: []Identity{{Issuer: "https://i", Subject: "s"}}}, "trustRoot"},
		{"escaping signature file", OMSRule{Keys: []string{filepath.Join(omsVectors, "keys/signing-key-pub.pem")}, SignatureFile: "../model.sig"}, "signatureFile"},
	} {
		_, err := NewPolicy(PolicyFile{Default: Rule{OMS: &c.rule, TransparencyLog: Waive}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
	// OMS keys need no transparency log: the default (require) is not an error for them.
	if _, err := NewPolicy(PolicyFile{Default: Rule{OMS: &OMSRule{Keys: []string{filepath.Join(omsVectors, "keys/signing-key-pub.pem")}}}}); err != nil {
		t.Fatal(err)
	}
}

// A referrer exempts nothing: beside it, a model.sig layer its statement does not list is unsigned content and
// is refused, naming it (only the signature-file layer that is itself the verifying signature is exempt).
func TestOMSReferrerExemptsNoLayer(t *testing.T) {
	host := startRegistry(t)
	ctx := context.Background()
	weights := []byte("weights")
	ref := pushFiles(t, host, "oms/junk", "v1", map[string][]byte{"model.safetensors": weights, "model.sig": []byte("not a signature")})
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	st, err := oms.NewStatement("junk", oms.Files{"model.safetensors": digestOf(weights).Encoded()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := oms.Sign(st, k)
	if err != nil {
		t.Fatal(err)
	}
	opts := plainTransports(t)
	c := writeClient(ctx, opts, ref)
	d, err := name.NewDigest(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := gcrremote.Get(d, c.remote...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := putOMSReferrer(d, desc.Descriptor, bundle, c); err != nil {
		t.Fatal(err)
	}
	pub := writePub(t, t.TempDir(), "k.pub", &k.PublicKey)
	dec, err := NewVerifier(omsPolicy(t, OMSRule{Keys: []string{pub}}), opts).Verify(ctx, ref)
	wantDenied(t, dec, err, ReasonModelMismatch)
	if !strings.Contains(err.Error(), `file "model.sig" is not listed`) {
		t.Fatalf("the unsigned model.sig layer is not named: %v", err)
	}
}

// TestOMSReferrerOldLayerType: referrers written before OMSLayerMediaType carry the bundle under its own media
// type (which made cosign verify take them for bundles of the manifest). New ones do not; old ones still verify.
func TestOMSReferrerOldLayerType(t *testing.T) {
	host := startRegistry(t)
	ctx := context.Background()
	key, pub := newKeys(t, t.TempDir(), "cosign")
	ref := pushFiles(t, host, "oms/old", "v1", map[string][]byte{"model.safetensors": []byte("old weights")})
	_, referrer, err := SignOMS(ctx, ref, key, SignOptions{Password: testPass, Registry: plainTransports(t)})
	if err != nil {
		t.Fatal(err)
	}
	d, err := name.NewDigest(ref)
	if err != nil {
		t.Fatal(err)
	}
	old := d.Context().Digest(referrer)
	desc, err := gcrremote.Get(old)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(desc.Manifest, []byte(`"mediaType":"`+OMSLayerMediaType+`"`)) || bytes.Contains(desc.Manifest, []byte("vnd.dev.sigstore.bundle")) {
		t.Fatalf("the referrer's layer must be of type %s, nothing cosign reads as a bundle: %s", OMSLayerMediaType, desc.Manifest)
	}
	raw := bytes.Replace(desc.Manifest, []byte(OMSLayerMediaType), []byte(oms.BundleMediaType), 1)
	rd := digestOf(raw)
	if err := gcrremote.Put(d.Context().Digest(rd.String()), rawManifest(raw)); err != nil {
		t.Fatal(err)
	}
	if err := gcrremote.Delete(old); err != nil {
		t.Fatal(err)
	}
	dec, err := NewVerifier(omsPolicy(t, OMSRule{Keys: []string{pub}}), plainTransports(t)).Verify(ctx, ref)
	if err != nil || !dec.Verified || !strings.Contains(dec.Authority, "referrer "+rd.String()) {
		t.Fatalf("an old-style OMS referrer: %+v, %v", dec, err)
	}
}
