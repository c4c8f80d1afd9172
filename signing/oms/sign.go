package oms

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
)

// NewStatement is the statement of a model signed by files with sha256, as `model_signing sign` makes it:
// resources sorted by name, the subject's digest over theirs. ignore is recorded as the serialization's
// ignore_paths (the signature file, at least, as the reference records it).
func NewStatement(name string, files Files, ignore []string) (*Statement, error) {
	st := &Statement{Name: name, Serialization: Serialization{Method: MethodFiles, HashType: "sha256", IgnorePaths: ignore}}
	names := make([]string, 0, len(files))
	for n := range files {
		if err := checkName(n, MethodFiles); err != nil {
			return nil, err
		}
		names = append(names, n)
	}
	sort.Strings(names)
	root := sha256.New()
	for _, n := range names {
		raw, err := hex.DecodeString(files[n])
		if err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("file %q: digest %q is not a hex sha256", n, files[n])
		}
		root.Write(raw)
		st.Resources = append(st.Resources, Resource{Name: n, Algorithm: "sha256", Digest: hex.EncodeToString(raw)})
	}
	st.RootDigest = hex.EncodeToString(root.Sum(nil))
	return st, nil
}

// JSON is the in-toto statement in the layout the reference writes.
func (st *Statement) JSON() ([]byte, error) {
	type subject struct {
		Name   string            `json:"name"`
		Digest map[string]string `json:"digest"`
	}
	resources := st.Resources
	if resources == nil {
		resources = []Resource{}
	}
	return json.MarshalIndent(struct {
		Type          string    `json:"_type"`
		Subject       []subject `json:"subject"`
		PredicateType string    `json:"predicateType"`
		Predicate     any       `json:"predicate"`
	}{
		Type:          StatementType,
		Subject:       []subject{{Name: st.Name, Digest: map[string]string{"sha256": st.RootDigest}}},
		PredicateType: PredicateType,
		Predicate: struct {
			Serialization Serialization `json:"serialization"`
			Resources     []Resource    `json:"resources"`
		}{st.Serialization, resources},
	}, "", "  ")
}

// Sign signs the statement with an ECDSA key, as `model_signing sign key` does: a v0.3 Sigstore bundle whose
// verification material names the public key by its hint, no transparency-log entry.
func Sign(st *Statement, signer crypto.Signer) ([]byte, error) {
	pub, ok := signer.Public().(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("OMS signs with ECDSA keys, not %T", signer.Public())
	}
	h, err := curveHash(pub)
	if err != nil {
		return nil, err
	}
	payload, err := st.JSON()
	if err != nil {
		return nil, err
	}
	d := h.New()
	d.Write(pae(PayloadType, payload))
	sig, err := signer.Sign(rand.Reader, d.Sum(nil), h)
	if err != nil {
		return nil, fmt.Errorf("signing: %w", err)
	}
	type signature struct {
		Sig   string `json:"sig"`
		KeyID string `json:"keyid"`
	}
	b := map[string]any{
		"mediaType": BundleMediaType,
		"verificationMaterial": map[string]any{
			"publicKey":   map[string]string{"hint": KeyHint(pub)},
			"tlogEntries": []any{},
		},
		"dsseEnvelope": map[string]any{
			"payload":     encodeB64(payload),
			"payloadType": PayloadType,
			"signatures":  []signature{{Sig: encodeB64(sig), KeyID: ""}},
		},
	}
	return json.MarshalIndent(b, "", "  ")
}
