package signing

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	cremote "github.com/sigstore/cosign/v2/pkg/cosign/remote"
	"github.com/sigstore/cosign/v2/pkg/oci/mutate"
	ociremote "github.com/sigstore/cosign/v2/pkg/oci/remote"
	"github.com/sigstore/cosign/v2/pkg/oci/static"
	"github.com/sigstore/sigstore/pkg/signature/options"
	"github.com/sigstore/sigstore/pkg/signature/payload"

	mpremote "github.com/modelpack/modelpack/artifact/remote"
)

// SignOptions configure SignDigest.
type SignOptions struct {
	// Registry reaches the registry (artifact/remote's one registry layer).
	Registry *mpremote.Transports
	// Password unlocks an encrypted private key (k8s:// Secrets with a cosign.password need none).
	Password PassFunc
	// Annotations are signed into the payload's "optional" section (cosign sign -a key=value).
	Annotations map[string]string
	// SecretsDir is where k8s:// key references are mounted; MODELPACK_SECRETS_DIR or DefaultSecretsDir if empty.
	SecretsDir string
}

// SignDigest signs the manifest digest ref points at (a tag is resolved once, and the digest is what gets
// signed) with a cosign private key, and stores the signature as `cosign sign --tlog-upload=false` does: a
// simple-signing payload in the `sha256-<hex>.sig` tag of the same repository. Nothing goes to a transparency
// log: verifiers waive that check (cosign verify --insecure-ignore-tlog, transparencyLog: waive). Signing again
// with the same key leaves one signature. It returns the signed digest reference.
func SignDigest(ctx context.Context, ref, keyRef string, opts SignOptions) (string, error) {
	sv, err := loadSigner(keyRef, opts.SecretsDir, opts.Password)
	if err != nil {
		return "", err
	}
	c := writeClient(ctx, opts.Registry, ref)
	d, err := resolve(ref, c)
	if err != nil {
		return "", fmt.Errorf("sign: %w", err)
	}
	var ann map[string]any
	if len(opts.Annotations) > 0 {
		ann = map[string]any{}
		for k, v := range opts.Annotations {
			ann[k] = v
		}
	}
	pl, err := (&payload.Cosign{Image: d, Annotations: ann}).MarshalJSON()
	if err != nil {
		return "", err
	}
	raw, err := sv.SignMessage(bytes.NewReader(pl), options.WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("sign: %w", err)
	}
	sig, err := static.NewSignature(pl, base64.StdEncoding.EncodeToString(raw))
	if err != nil {
		return "", err
	}
	se, err := ociremote.SignedEntity(d, c.oci...)
	var notFound *ociremote.EntityNotFoundError
	switch {
	case errors.As(err, &notFound):
		return "", fmt.Errorf("sign: %s not found in the registry", d)
	case err != nil:
		return "", fmt.Errorf("sign: reading %s: %w", d, err)
	}
	signed, err := mutate.AttachSignatureToEntity(se, sig, mutate.WithDupeDetector(cremote.NewDupeDetector(sv)))
	if err != nil {
		return "", err
	}
	if err := ociremote.WriteSignatures(d.Repository, signed, c.oci...); err != nil {
		return "", fmt.Errorf("sign: storing the signature of %s: %w", d, err)
	}
	return d.String(), nil
}

func resolve(ref string, c client) (name.Digest, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return name.Digest{}, err
	}
	d, err := ociremote.ResolveDigest(r, c.oci...)
	if err != nil {
		return name.Digest{}, fmt.Errorf("resolving %s: %w", ref, err)
	}
	return d, nil
}
