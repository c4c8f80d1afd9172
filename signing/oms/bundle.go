// Package oms reads, checks and writes OpenSSF Model Signing (OMS v1.0) signatures: a Sigstore bundle whose DSSE
// envelope carries an in-toto statement listing every file of a model with its digest (the format of
// sigstore/model-transparency's `model.sig`). It verifies the envelope with a public key or an X.509 chain itself,
// hands keyless bundles to the caller's Sigstore verifier, and compares the signed file list with a model: a
// directory, or the layers of an OCI artifact.
package oms

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
)

// Names the format fixes.
const (
	// BundleMediaType is the Sigstore bundle version the reference writes and accepts for key and certificate
	// signatures (keyless ones come from sigstore-python and may be older bundle versions).
	BundleMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json"
	PayloadType     = "application/vnd.in-toto+json"
	StatementType   = "https://in-toto.io/Statement/v1"
	PredicateType   = "https://model_signing/signature/v1.0"
	// SignatureFile is the file name OMS writes beside the model by default.
	SignatureFile = "model.sig"
	// MethodFiles and MethodShards are the serializations: one digest per file, or per shard_size bytes of it.
	MethodFiles  = "files"
	MethodShards = "shards"
)

// maxSignatureSize bounds what is read and parsed: a statement lists one line per file (or shard), so a
// signature of a model with a million files stays well under it.
const maxSignatureSize = 64 << 20

// Signature is a parsed OMS signature. Nothing in it is trusted until Verify returns its statement.
type Signature struct {
	raw       []byte
	MediaType string
	payload   []byte
	sigs      [][]byte
	KeyHint   string   // hex SHA-256 of the signer's PEM public key, when the bundle names it
	PublicKey []byte   // PEM public key carried in the bundle (v1.0.0 signatures): informational only
	Chain     [][]byte // DER certificates, leaf first: x509CertificateChain, or the single keyless certificate
	Keyless   bool     // the material is a single certificate (Sigstore/Fulcio), checked by a Sigstore verifier
	statement *Statement
}

// Payload is the DSSE payload (the in-toto statement's JSON).
func (s *Signature) Payload() []byte { return s.payload }

// UnverifiedStatement is the statement the signature carries, parsed and self-consistent but not verified: what
// a signer may compare with the model before attaching the signature, never what a verifier may trust (Verify).
func (s *Signature) UnverifiedStatement() *Statement { return s.statement }

// Statement is the signed content of a signature: the model's name, its root digest and its resources.
type Statement struct {
	Name          string
	RootDigest    string // hex SHA-256 over the resources' digests in order
	Serialization Serialization
	Resources     []Resource
}

// Serialization says how the resources were computed, so a verifier can compute them again.
type Serialization struct {
	Method        string   `json:"method"`
	HashType      string   `json:"hash_type"`
	AllowSymlinks bool     `json:"allow_symlinks"`
	ShardSize     int64    `json:"shard_size,omitempty"`
	IgnorePaths   []string `json:"ignore_paths,omitempty"`
}

// Resource is one file (or shard "path:start:end") and its digest.
type Resource struct {
	Name      string `json:"name"`
	Algorithm string `json:"algorithm"`
	Digest    string `json:"digest"`
}

// File is the model path a resource covers (the name itself for files, the path before ":start:end" for shards).
func (r Resource) File(method string) string {
	if method == MethodShards {
		if p, _, err := splitShard(r.Name); err == nil {
			return p
		}
	}
	return r.Name
}

type bundleJSON struct {
	MediaType            string `json:"mediaType"`
	VerificationMaterial *struct {
		PublicKey *struct {
			Hint string `json:"hint"`
		} `json:"publicKey"`
		X509CertificateChain *struct {
			Certificates []struct {
				RawBytes []byte `json:"rawBytes"`
			} `json:"certificates"`
		} `json:"x509CertificateChain"`
		Certificate *struct {
			RawBytes []byte `json:"rawBytes"`
		} `json:"certificate"`
	} `json:"verificationMaterial"`
	DSSEEnvelope *struct {
		Payload     []byte `json:"payload"`
		PayloadType string `json:"payloadType"`
		Signatures  []struct {
			Sig []byte `json:"sig"`
		} `json:"signatures"`
	} `json:"dsseEnvelope"`
	MessageSignature json.RawMessage `json:"messageSignature"`
}

// Parse reads an OMS signature: a Sigstore bundle with a DSSE envelope of an in-toto statement. It checks the
// structure only; Verify checks who signed it.
func Parse(data []byte) (*Signature, error) {
	if len(data) > maxSignatureSize {
		return nil, fmt.Errorf("OMS signature: %d bytes, over the %d-byte limit", len(data), maxSignatureSize)
	}
	var b bundleJSON
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("OMS signature: not a Sigstore bundle (JSON): %w", err)
	}
	if !strings.HasPrefix(b.MediaType, "application/vnd.dev.sigstore.bundle") {
		return nil, fmt.Errorf("OMS signature: mediaType %q is not a Sigstore bundle (want %s)", b.MediaType, BundleMediaType)
	}
	if b.DSSEEnvelope == nil {
		if b.MessageSignature != nil {
			return nil, errors.New("OMS signature: the bundle holds a messageSignature, not the dsseEnvelope OMS signs")
		}
		return nil, errors.New("OMS signature: the bundle has no dsseEnvelope")
	}
	env := b.DSSEEnvelope
	if env.PayloadType != PayloadType {
		return nil, fmt.Errorf("OMS signature: dsseEnvelope.payloadType %q, want %s", env.PayloadType, PayloadType)
	}
	if len(env.Signatures) != 1 || len(env.Signatures[0].Sig) == 0 {
		return nil, fmt.Errorf("OMS signature: dsseEnvelope.signatures holds %d signatures, want exactly one", len(env.Signatures))
	}
	s := &Signature{raw: data, MediaType: b.MediaType, payload: env.Payload, sigs: [][]byte{env.Signatures[0].Sig}}
	vm := b.VerificationMaterial
	if vm == nil {
		return nil, errors.New("OMS signature: the bundle has no verificationMaterial")
	}
	switch {
	case vm.PublicKey != nil:
		// v1.0.0 signatures carry the PEM key itself (rawBytes); it proves nothing, the verifier's key decides.
		s.KeyHint = vm.PublicKey.Hint
	case vm.X509CertificateChain != nil:
		for i, c := range vm.X509CertificateChain.Certificates {
			if len(c.RawBytes) == 0 {
				return nil, fmt.Errorf("OMS signature: verificationMaterial.x509CertificateChain.certificates[%d] is empty", i)
			}
			s.Chain = append(s.Chain, c.RawBytes)
		}
		if len(s.Chain) == 0 {
			return nil, errors.New("OMS signature: verificationMaterial.x509CertificateChain has no certificate")
		}
	case vm.Certificate != nil && len(vm.Certificate.RawBytes) > 0:
		s.Chain, s.Keyless = [][]byte{vm.Certificate.RawBytes}, true
	default:
		return nil, errors.New("OMS signature: verificationMaterial has neither publicKey, x509CertificateChain nor certificate")
	}
	var err error
	if s.statement, err = ParseStatement(env.Payload); err != nil {
		return nil, err
	}
	return s, nil
}

type statementJSON struct {
	Type    string `json:"_type"`
	Subject []struct {
		Name   string            `json:"name"`
		Digest map[string]string `json:"digest"`
	} `json:"subject"`
	PredicateType string `json:"predicateType"`
	Predicate     *struct {
		Serialization *Serialization `json:"serialization"`
		Resources     []Resource     `json:"resources"`
	} `json:"predicate"`
}

// ParseStatement reads the in-toto statement of an OMS signature and checks it is self-consistent: one subject,
// whose sha256 is the digest over the resources' digests, unique resource names that stay inside the model, and a
// serialization this package can compute again.
func ParseStatement(payload []byte) (*Statement, error) {
	var st statementJSON
	if err := json.Unmarshal(payload, &st); err != nil {
		return nil, fmt.Errorf("OMS statement: not JSON: %w", err)
	}
	if st.Type != StatementType {
		return nil, fmt.Errorf("OMS statement: _type %q, want %s", st.Type, StatementType)
	}
	if st.PredicateType != PredicateType {
		return nil, fmt.Errorf("OMS statement: predicateType %q, want %s (the v0.2 format is not accepted)", st.PredicateType, PredicateType)
	}
	if len(st.Subject) != 1 {
		return nil, fmt.Errorf("OMS statement: %d subjects, want exactly one", len(st.Subject))
	}
	if st.Predicate == nil || st.Predicate.Serialization == nil {
		return nil, errors.New("OMS statement: predicate.serialization is missing")
	}
	ser := *st.Predicate.Serialization
	switch ser.Method {
	case MethodFiles:
	case MethodShards:
		if ser.ShardSize <= 0 {
			return nil, fmt.Errorf("OMS statement: shard_size %d, want a positive size", ser.ShardSize)
		}
	default:
		return nil, fmt.Errorf("OMS statement: serialization.method %q is not valid (valid: files, shards)", ser.Method)
	}
	out := &Statement{Name: st.Subject[0].Name, RootDigest: st.Subject[0].Digest["sha256"], Serialization: ser}
	root := sha256.New()
	seen := map[string]bool{}
	for i, r := range st.Predicate.Resources {
		if r.Algorithm != ser.HashType {
			return nil, fmt.Errorf("OMS statement: resources[%d] (%q): algorithm %q, but serialization.hash_type is %q", i, r.Name, r.Algorithm, ser.HashType)
		}
		raw, err := hex.DecodeString(r.Digest)
		if err != nil || len(raw) == 0 {
			return nil, fmt.Errorf("OMS statement: resources[%d] (%q): digest %q is not hex", i, r.Name, r.Digest)
		}
		r.Digest = hex.EncodeToString(raw) // one spelling, so comparisons are exact
		if err := checkName(r.Name, ser.Method); err != nil {
			return nil, fmt.Errorf("OMS statement: resources[%d]: %w", i, err)
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("OMS statement: resources[%d]: %q is listed twice", i, r.Name)
		}
		seen[r.Name] = true
		root.Write(raw)
		out.Resources = append(out.Resources, r)
	}
	if got := hex.EncodeToString(root.Sum(nil)); got != strings.ToLower(out.RootDigest) {
		return nil, fmt.Errorf("OMS statement: subject digest sha256:%s is not the digest of the resources (sha256:%s)", out.RootDigest, got)
	}
	return out, nil
}

// checkName refuses resource names that could reach outside the model: absolute, "..", or not in clean form.
// "." is the one name a single-file model has.
func checkName(name, method string) error {
	p := name
	if method == MethodShards {
		var err error
		if p, _, err = splitShard(name); err != nil {
			return err
		}
	}
	if p == "" || p != path.Clean(p) || path.IsAbs(p) || p == ".." || strings.HasPrefix(p, "../") || strings.ContainsRune(p, 0) {
		return fmt.Errorf("resource name %q is not a clean relative path inside the model", name)
	}
	return nil
}

type shard struct{ start, end int64 }

// splitShard parses "path:start:end" (the path may not hold ':'; the reference splits on every ':').
func splitShard(name string) (string, shard, error) {
	parts := strings.Split(name, ":")
	if len(parts) != 3 {
		return "", shard{}, fmt.Errorf("shard name %q: want path:start:end", name)
	}
	start, err1 := strconv.ParseInt(parts[1], 10, 64)
	end, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil || start < 0 || end <= start {
		return "", shard{}, fmt.Errorf("shard name %q: want path:start:end with 0 <= start < end", name)
	}
	return parts[0], shard{start, end}, nil
}

// pae is DSSE's pre-authentication encoding, what the signature covers.
func pae(payloadType string, payload []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "DSSEv1 %d %s %d ", len(payloadType), payloadType, len(payload))
	b.Write(payload)
	return b.Bytes()
}

// encodeB64 is how bundles spell bytes.
func encodeB64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
