package oms

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sigstore/sigstore-go/pkg/root"

	"github.com/modelpack/modelpack/artifact"
)

const vectors = "testdata/vectors"

type vector struct {
	dir    string
	model  string // relative to the copied folder; "" is the folder itself
	ignore []string
	method string // key, chain, keyless
}

// The reference's own verification commands (scripts/tests/test-verify-v*.sh) for every vector from v1.0.0 on.
var allVectors = []vector{
	{"v1.0.0-elliptic-key", "signme-1", nil, "key"},
	{"v1.0.0-certificate", "", nil, "chain"},
	{"v1.0.0-certificate", "", nil, "key"}, // verify_test.py checks the certificate folder with the bare key too
	{"v1.0.0-sigstore", "", nil, "keyless"},
	{"v1.0.1-elliptic-key", "", []string{"ignore-me"}, "key"},
	{"v1.0.1-certificate", "", []string{"ignore-me"}, "chain"},
	{"v1.0.1-sigstore", "", []string{"ignore-me"}, "keyless"},
	{"v1.1.0-elliptic-key", "", nil, "key"}, // ignore-me is in the statement's ignore_paths
	{"v1.1.0-certificate", "", nil, "chain"},
	{"v1.1.0-sigstore", "", nil, "keyless"},
}

func read(t testing.TB, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func verifierFor(t *testing.T, method string) Verifier {
	t.Helper()
	switch method {
	case "key":
		v, err := NewKeyVerifier("signing-key-pub.pem", read(t, filepath.Join(vectors, "keys/signing-key-pub.pem")))
		if err != nil {
			t.Fatal(err)
		}
		return v
	case "chain":
		v, err := NewChainVerifier("ca-cert.pem", read(t, filepath.Join(vectors, "keys/ca-cert.pem")))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tr, err := root.NewTrustedRootFromJSON(read(t, "testdata/public-good-trusted_root.json"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewKeylessVerifier("stefanb", tr, "https://sigstore.verify.ibm.com/oauth2", "", "stefanb@us.ibm.com", "", KeylessOptions{RequireTlog: true, RequireSCT: true})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// copyVector copies a vector folder into a temporary directory, so each case can damage its own copy.
func copyVector(t *testing.T, name string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), name)
	if err := os.CopyFS(dst, os.DirFS(filepath.Join(vectors, name))); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestVectorsVerify(t *testing.T) {
	for _, vc := range allVectors {
		t.Run(vc.dir+"/"+vc.method, func(t *testing.T) {
			dir := copyVector(t, vc.dir)
			st, err := VerifyDir(filepath.Join(dir, vc.model), filepath.Join(dir, SignatureFile), verifierFor(t, vc.method), vc.ignore)
			if err != nil {
				t.Fatalf("a reference vector does not verify: %v", err)
			}
			if len(st.Resources) == 0 {
				t.Fatal("verified statement lists no resource")
			}
		})
	}
}

// TestVectorsTampered damages each vector as an attacker would: one byte of a signed file, a file added, a file
// removed, a verifier for another signer. Each is refused, naming the file or the reason.
func TestVectorsTampered(t *testing.T) {
	for _, vc := range allVectors {
		single := vc.model != ""
		cases := []struct {
			name   string
			damage func(t *testing.T, dir string)
			want   string // a file the error must name
		}{
			{"byte flipped", func(t *testing.T, dir string) { flipByte(t, filepath.Join(dir, "signme-1"), 3) }, `"signme-1" has digest`},
		}
		if !single {
			cases = append(cases,
				struct {
					name   string
					damage func(t *testing.T, dir string)
					want   string
				}{"file added", func(t *testing.T, dir string) {
					if err := os.WriteFile(filepath.Join(dir, "extra.bin"), []byte("unsigned"), 0o644); err != nil {
						t.Fatal(err)
					}
				}, `"extra.bin" is not listed`},
				struct {
					name   string
					damage func(t *testing.T, dir string)
					want   string
				}{"file removed", func(t *testing.T, dir string) {
					if err := os.Remove(filepath.Join(dir, "signme-2")); err != nil {
						t.Fatal(err)
					}
				}, `"signme-2" is signed but missing`},
			)
		}
		for _, c := range cases {
			t.Run(vc.dir+"/"+vc.method+"/"+c.name, func(t *testing.T) {
				dir := copyVector(t, vc.dir)
				c.damage(t, dir)
				_, err := VerifyDir(filepath.Join(dir, vc.model), filepath.Join(dir, SignatureFile), verifierFor(t, vc.method), vc.ignore)
				if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("got %v, want a mismatch naming %s", err, c.want)
				}
			})
		}
		t.Run(vc.dir+"/"+vc.method+"/other signer", func(t *testing.T) {
			dir := copyVector(t, vc.dir)
			_, err := VerifyDir(filepath.Join(dir, vc.model), filepath.Join(dir, SignatureFile), otherVerifier(t, vc.method), vc.ignore)
			var ve *VerifyError
			if !errors.As(err, &ve) {
				t.Fatalf("got %v, want a refusal of the signer", err)
			}
			t.Log(err)
		})
	}
}

// flipByte changes one byte in place, as `dd conv=notrunc` would.
func flipByte(t *testing.T, p string, off int64) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x01
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func otherVerifier(t *testing.T, method string) Verifier {
	t.Helper()
	switch method {
	case "key":
		k, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
		v, err := NewKeyVerifier("other.pub", pemPublic(t, &k.PublicKey))
		if err != nil {
			t.Fatal(err)
		}
		return v
	case "chain":
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other-root"}, NotBefore: time.Unix(0, 0), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
		if err != nil {
			t.Fatal(err)
		}
		v, err := NewChainVerifier("other-ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tr, err := root.NewTrustedRootFromJSON(read(t, "testdata/public-good-trusted_root.json"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewKeylessVerifier("mallory", tr, "https://sigstore.verify.ibm.com/oauth2", "", "mallory@example.com", "", KeylessOptions{RequireTlog: true, RequireSCT: true})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func pemPublic(t testing.TB, pub *ecdsa.PublicKey) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// A statement edited after signing (a digest swapped to match a tampered file) no longer verifies.
func TestEditedStatementRefused(t *testing.T) {
	for _, vc := range allVectors {
		if vc.method == "keyless" {
			continue
		}
		t.Run(vc.dir+"/"+vc.method, func(t *testing.T) {
			dir := copyVector(t, vc.dir)
			var b map[string]any
			if err := json.Unmarshal(read(t, filepath.Join(dir, SignatureFile)), &b); err != nil {
				t.Fatal(err)
			}
			env := b["dsseEnvelope"].(map[string]any)
			payload, _ := base64.StdEncoding.DecodeString(env["payload"].(string))
			env["payload"] = base64.StdEncoding.EncodeToString([]byte(strings.Replace(string(payload), `"name": "signme-1"`, `"name": "signme-3"`, 1)))
			out, _ := json.Marshal(b)
			if err := os.WriteFile(filepath.Join(dir, SignatureFile), out, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := VerifyDir(filepath.Join(dir, vc.model), filepath.Join(dir, SignatureFile), verifierFor(t, vc.method), vc.ignore)
			if !errors.Is(err, ErrWrongKey) && !errors.Is(err, ErrInvalid) {
				t.Fatalf("an edited statement: got %v, want the signature refused", err)
			}
		})
	}
}

// checkStructure is what every OMS signature looks like: the reference's vectors and what Sign writes.
func checkStructure(t *testing.T, raw []byte) {
	t.Helper()
	var b struct {
		MediaType    string `json:"mediaType"`
		DSSEEnvelope struct {
			Payload     []byte `json:"payload"`
			PayloadType string `json:"payloadType"`
			Signatures  []struct {
				Sig []byte `json:"sig"`
			} `json:"signatures"`
		} `json:"dsseEnvelope"`
		VerificationMaterial map[string]json.RawMessage `json:"verificationMaterial"`
	}
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatal(err)
	}
	if b.MediaType != BundleMediaType || b.DSSEEnvelope.PayloadType != PayloadType || len(b.DSSEEnvelope.Signatures) != 1 {
		t.Fatalf("bundle: mediaType %q payloadType %q %d signatures", b.MediaType, b.DSSEEnvelope.PayloadType, len(b.DSSEEnvelope.Signatures))
	}
	if len(b.VerificationMaterial) == 0 {
		t.Fatal("no verificationMaterial")
	}
	var st struct {
		Type    string `json:"_type"`
		Subject []struct {
			Name   string            `json:"name"`
			Digest map[string]string `json:"digest"`
		} `json:"subject"`
		PredicateType string `json:"predicateType"`
		Predicate     struct {
			Serialization map[string]any `json:"serialization"`
			Resources     []map[string]string
		} `json:"predicate"`
	}
	if err := json.Unmarshal(b.DSSEEnvelope.Payload, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type != StatementType || st.PredicateType != PredicateType || len(st.Subject) != 1 || len(st.Subject[0].Digest["sha256"]) != 64 {
		t.Fatalf("statement: %+v", st)
	}
	for _, k := range []string{"method", "hash_type", "allow_symlinks"} {
		if _, ok := st.Predicate.Serialization[k]; !ok {
			t.Fatalf("serialization lacks %q: %v", k, st.Predicate.Serialization)
		}
	}
	for _, r := range st.Predicate.Resources {
		if r["name"] == "" || r["algorithm"] == "" || r["digest"] == "" || len(r) != 3 {
			t.Fatalf("resource %v: want exactly name, algorithm, digest", r)
		}
	}
}

func TestVectorsStructure(t *testing.T) {
	for _, vc := range allVectors {
		checkStructure(t, read(t, filepath.Join(vectors, vc.dir, SignatureFile)))
	}
	// The key hint is the reference's: SHA-256 of the PEM public key.
	s, err := Parse(read(t, filepath.Join(vectors, "v1.1.0-elliptic-key", SignatureFile)))
	if err != nil {
		t.Fatal(err)
	}
	v := verifierFor(t, "key").(*KeyVerifier)
	if s.KeyHint != v.hint {
		t.Fatalf("key hint %s, the reference wrote %s", v.hint, s.KeyHint)
	}
}

// Sign writes what the reference writes for `sign key`, and what it writes verifies here.
func TestSignRoundTrip(t *testing.T) {
	for _, curve := range []elliptic.Curve{elliptic.P256(), elliptic.P384()} {
		k, _ := ecdsa.GenerateKey(curve, rand.Reader)
		dir := copyVector(t, "v1.1.0-elliptic-key")
		files, err := HashDir(dir, Serialization{Method: MethodFiles, HashType: "sha256"}, []string{SignatureFile, "ignore-me"})
		if err != nil {
			t.Fatal(err)
		}
		st, err := NewStatement(filepath.Base(dir), files, []string{SignatureFile, "ignore-me"})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := Sign(st, k)
		if err != nil {
			t.Fatal(err)
		}
		checkStructure(t, raw)
		// Same resources as the reference signed for this folder.
		ref, err := Parse(read(t, filepath.Join(vectors, "v1.1.0-elliptic-key", SignatureFile)))
		if err != nil {
			t.Fatal(err)
		}
		if ref.statement.RootDigest != st.RootDigest {
			t.Fatalf("root digest %s, the reference signed %s", st.RootDigest, ref.statement.RootDigest)
		}
		if err := os.WriteFile(filepath.Join(dir, SignatureFile), raw, 0o644); err != nil {
			t.Fatal(err)
		}
		v, err := NewKeyVerifier("k.pub", pemPublic(t, &k.PublicKey))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := VerifyDir(dir, filepath.Join(dir, SignatureFile), v, nil); err != nil {
			t.Fatalf("%s: our own signature does not verify: %v", curve.Params().Name, err)
		}
		flipByte(t, filepath.Join(dir, "signme-2"), 0)
		if _, err := VerifyDir(dir, filepath.Join(dir, SignatureFile), v, nil); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "signme-2") {
			t.Fatalf("tampered: %v", err)
		}
	}
}

// Shard serialization: the reference's shard layout, computed and checked; a changed byte names its file.
func TestShards(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "w.bin"), []byte(strings.Repeat("x", 25)), 0o644); err != nil {
		t.Fatal(err)
	}
	ser := Serialization{Method: MethodShards, HashType: "sha256", ShardSize: 10}
	files, err := HashDir(dir, ser, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"w.bin:0:10", "w.bin:10:20", "w.bin:20:25"} {
		if files[n] == "" {
			t.Fatalf("shard %s missing from %v", n, files)
		}
	}
	st := &Statement{Serialization: ser}
	for n, d := range files {
		st.Resources = append(st.Resources, Resource{Name: n, Algorithm: "sha256", Digest: d})
	}
	flipByte(t, filepath.Join(dir, "w.bin"), 12)
	files, _ = HashDir(dir, ser, nil)
	if err := st.Check(files); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), `"w.bin" has digest`) || !strings.Contains(err.Error(), "bytes 10 to 20") {
		t.Fatalf("got %v", err)
	}
}

func TestParseRefuses(t *testing.T) {
	good := read(t, filepath.Join(vectors, "v1.1.0-elliptic-key", SignatureFile))
	var b map[string]any
	_ = json.Unmarshal(good, &b)
	env := b["dsseEnvelope"].(map[string]any)
	payload, _ := base64.StdEncoding.DecodeString(env["payload"].(string))
	for _, c := range []struct{ name, from, to, want string }{
		{"predicate type", PredicateType, "https://example.com/other", "predicateType"},
		{"escaping name", `"name": "signme-1"`, `"name": "../signme-1"`, "clean relative path"},
		{"root digest", `"sha256": "9`, `"sha256": "0`, "subject digest"},
		{"method", `"method": "files"`, `"method": "magic"`, "serialization.method"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := strings.Replace(string(payload), c.from, c.to, 1)
			if p == string(payload) {
				t.Fatalf("%q not in the payload", c.from)
			}
			env["payload"] = base64.StdEncoding.EncodeToString([]byte(p))
			out, _ := json.Marshal(b)
			if _, err := Parse(out); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming %s", err, c.want)
			}
		})
	}
}

// An artifact's manifest answers file serialization with sha256 only: tar layers, shards and BLAKE2 would need
// the files read again, and are refused as such rather than passed.
func TestArtifactFilesRefusesWhatNeedsRehash(t *testing.T) {
	raw := artifact.Layer{Descriptor: ocispec.Descriptor{Digest: digest.FromString("w")}, Path: "w.bin", Format: artifact.FormatRaw}
	sig := artifact.Layer{Descriptor: ocispec.Descriptor{Digest: digest.FromString("s")}, Path: "model.sig", Format: artifact.FormatRaw}
	tar := artifact.Layer{Descriptor: ocispec.Descriptor{Digest: digest.FromString("t")}, Path: "tokenizer", Format: artifact.FormatTar}
	files := Serialization{Method: MethodFiles, HashType: "sha256"}
	got, err := ArtifactFiles([]artifact.Layer{raw, sig}, files, SignatureFile)
	if err != nil || len(got) != 1 || got["w.bin"] != digest.FromString("w").Encoded() {
		t.Fatalf("raw layers: %v %v", got, err)
	}
	if got, _ := ArtifactFiles([]artifact.Layer{raw, sig}, files, ""); len(got) != 2 {
		t.Fatalf("no signature layer exempt: %v", got)
	}
	for name, c := range map[string]struct {
		layers []artifact.Layer
		ser    Serialization
	}{
		"tar layer": {[]artifact.Layer{raw, tar}, files},
		"shards":    {[]artifact.Layer{raw}, Serialization{Method: MethodShards, HashType: "sha256", ShardSize: 1 << 30}},
		"blake2":    {[]artifact.Layer{raw}, Serialization{Method: MethodFiles, HashType: "blake2"}},
	} {
		if _, err := ArtifactFiles(c.layers, c.ser, SignatureFile); !errors.Is(err, ErrNeedsRehash) {
			t.Errorf("%s: got %v, want ErrNeedsRehash", name, err)
		}
	}
}
