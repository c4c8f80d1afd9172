package signing

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/sigstore/cosign/v2/pkg/cosign"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
)

// Key references: a file path, env://VAR (the PEM itself in an environment variable), or k8s://NAMESPACE/NAME,
// a Kubernetes Secret in cosign's layout (cosign.pub, cosign.key, cosign.password) read from where it is mounted
// below the secrets directory, so the node driver needs no API-server access.
const (
	envScheme = "env://"
	k8sScheme = "k8s://"
)

// Files of a cosign key-pair Secret (cosign generate-key-pair k8s://NS/NAME writes these keys).
const (
	secretPublicKey  = "cosign.pub"
	secretPrivateKey = "cosign.key"
	secretPassword   = "cosign.password"
)

// PassFunc returns the password of an encrypted private key; confirm asks twice (when creating a key).
type PassFunc = cosign.PassFunc

var k8sName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)

func secretsDirFromEnv() string {
	if d := os.Getenv("MODELPACK_SECRETS_DIR"); d != "" {
		return d
	}
	return DefaultSecretsDir
}

// loader reads key and trust-root files for a policy and hashes what it read into the policy version.
type loader struct {
	secretsDir string
	hash       hash.Hash
}

// read returns the bytes a key reference names; secretFile picks the key of a k8s:// Secret.
func (l *loader) read(ref, secretFile string) ([]byte, error) {
	var data []byte
	var err error
	switch {
	case strings.HasPrefix(ref, envScheme):
		name := strings.TrimPrefix(ref, envScheme)
		v, ok := os.LookupEnv(name)
		if name == "" || !ok || v == "" {
			return nil, fmt.Errorf("%s: environment variable %q is not set", ref, name)
		}
		data = []byte(v)
	case strings.HasPrefix(ref, k8sScheme):
		var path string
		if path, err = l.secretPath(ref, secretFile); err != nil {
			return nil, err
		}
		if data, err = os.ReadFile(path); err != nil {
			return nil, fmt.Errorf("%s: reading the mounted Secret: %w", ref, err)
		}
	case strings.Contains(ref, "://"):
		return nil, fmt.Errorf("%s: unsupported key reference (valid: a file path, env://VAR, k8s://NAMESPACE/NAME)", ref)
	default:
		if data, err = os.ReadFile(ref); err != nil {
			return nil, err
		}
	}
	if l.hash != nil {
		fmt.Fprintf(l.hash, "\x00%s\x00%d\x00", ref, len(data))
		l.hash.Write(data)
	}
	return data, nil
}

func (l *loader) secretPath(ref, secretFile string) (string, error) {
	ns, name, ok := strings.Cut(strings.TrimPrefix(ref, k8sScheme), "/")
	if !ok || !k8sName.MatchString(ns) || !k8sName.MatchString(name) {
		return "", fmt.Errorf("%s: want k8s://NAMESPACE/NAME", ref)
	}
	dir := l.secretsDir
	if dir == "" {
		dir = secretsDirFromEnv()
	}
	return filepath.Join(dir, ns, name, secretFile), nil
}

// publicKey loads a PEM public key as cosign does (SHA-256 for ECDSA and RSA).
func (l *loader) publicKey(ref string) (signature.Verifier, error) {
	raw, err := l.read(ref, secretPublicKey)
	if err != nil {
		return nil, err
	}
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: not a PEM public key: %w", ref, err)
	}
	return signature.LoadVerifier(pub, crypto.SHA256)
}

// loadSigner loads a cosign-encrypted private key. A k8s:// Secret supplies its own password when it has one.
func loadSigner(ref, secretsDir string, pass PassFunc) (signature.SignerVerifier, error) {
	l := &loader{secretsDir: secretsDir}
	raw, err := l.read(ref, secretPrivateKey)
	if err != nil {
		return nil, err
	}
	var pw []byte
	if strings.HasPrefix(ref, k8sScheme) {
		p, _ := l.secretPath(ref, secretPassword)
		if pw, err = os.ReadFile(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w", ref, err)
		}
	}
	if pw == nil && pass != nil {
		if pw, err = pass(false); err != nil {
			return nil, fmt.Errorf("reading the key password: %w", err)
		}
	}
	sv, err := cosign.LoadPrivateKey(raw, pw, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	return sv, nil
}

// PEM block types of private keys (RFC 7468 and SEC1), as openssl, Go and Python's cryptography write them.
const (
	pemECPrivateKey        = "EC PRIVATE KEY"        // SEC1: openssl ecparam -genkey, x509.MarshalECPrivateKey
	pemPKCS8PrivateKey     = "PRIVATE KEY"           // PKCS#8: openssl genpkey, x509.MarshalPKCS8PrivateKey
	pemEncryptedPKCS8      = "ENCRYPTED PRIVATE KEY" // PKCS#8 with a password (openssl genpkey -aes256)
	pemECParameters        = "EC PARAMETERS"         // what openssl ecparam -genkey writes before the key
	omsPrivateKeyTypesHelp = "a cosign key (cosign generate-key-pair, modelpack key generate, cosign import-key-pair) or a PEM ECDSA key: EC PRIVATE KEY (SEC1, plain or encrypted with openssl ec -aes256) or PRIVATE KEY (PKCS#8, plain), on P-256, P-384 or P-521"
)

// loadOMSSigner loads the private key an OMS signature is made with. model_signing signs with plain PEM ECDSA
// keys (SEC1 or PKCS#8, what openssl and Python's cryptography write); those are read as they are, asking for
// no password (only an RFC 1423-encrypted SEC1 key asks pass for one). Anything else is read as a cosign key, as
// loadSigner does. Only ECDSA keys on the curves OMS pairs with a hash are accepted.
func loadOMSSigner(ref, secretsDir string, pass PassFunc) (crypto.Signer, error) {
	raw, err := (&loader{secretsDir: secretsDir}).read(ref, secretPrivateKey)
	if err != nil {
		return nil, err
	}
	var block *pem.Block
	for rest := raw; ; {
		if block, rest = pem.Decode(rest); block == nil || block.Type != pemECParameters {
			break
		}
	}
	var signer crypto.Signer
	switch {
	case block == nil:
		return nil, fmt.Errorf("%s: not a PEM private key (want %s)", ref, omsPrivateKeyTypesHelp)
	case block.Type == pemECPrivateKey || block.Type == pemPKCS8PrivateKey:
		// openssl ec -aes256 writes RFC 1423 encryption, which Python's cryptography (and so model_signing's
		// password) reads; deprecated for its weak KDF, it is the one encrypted PEM form the standard library reads.
		if x509.IsEncryptedPEMBlock(block) { //nolint:staticcheck
			if pass == nil {
				return nil, fmt.Errorf("%s: an encrypted %s needs a password (COSIGN_PASSWORD)", ref, block.Type)
			}
			pw, err := pass(false)
			if err != nil {
				return nil, fmt.Errorf("%s: password of an encrypted %s: %w", ref, block.Type, err)
			}
			der, err := x509.DecryptPEMBlock(block, pw) //nolint:staticcheck
			if err != nil {
				return nil, fmt.Errorf("%s: decrypting the %s: %w", ref, block.Type, err)
			}
			block = &pem.Block{Type: block.Type, Bytes: der}
		}
		k, err := cryptoutils.UnmarshalPEMToPrivateKey(pem.EncodeToMemory(block), nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", ref, block.Type, err)
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%s: a %T key cannot sign", ref, k)
		}
		signer = s
	case block.Type == pemEncryptedPKCS8:
		return nil, fmt.Errorf("%s: an encrypted PKCS#8 key (%s) is not supported: decrypt it (openssl pkcs8 -in KEY -out plain.pem) or convert it to a cosign key (cosign import-key-pair --key KEY); want %s", ref, block.Type, omsPrivateKeyTypesHelp)
	default:
		sv, err := loadSigner(ref, secretsDir, pass)
		if err != nil {
			return nil, err
		}
		s, ok := sv.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%s: this key cannot sign OMS signatures (want %s)", ref, omsPrivateKeyTypesHelp)
		}
		signer = s
	}
	pub, ok := signer.Public().(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("%s: a %T key: OMS signs with ECDSA keys only (want %s)", ref, signer.Public(), omsPrivateKeyTypesHelp)
	}
	switch pub.Curve {
	case elliptic.P256(), elliptic.P384(), elliptic.P521():
	default:
		return nil, fmt.Errorf("%s: ECDSA curve %s: OMS signs on P-256, P-384 or P-521 only", ref, pub.Curve.Params().Name)
	}
	return signer, nil
}

// GenerateKeyPair writes a cosign key pair, PREFIX.key (encrypted with the password pass returns, mode 0600) and
// PREFIX.pub, the files `cosign generate-key-pair` writes. It refuses to overwrite existing files unless force.
func GenerateKeyPair(prefix string, pass PassFunc, force bool) (keyPath, pubPath string, err error) {
	keyPath, pubPath = prefix+".key", prefix+".pub"
	if !force {
		for _, p := range []string{keyPath, pubPath} {
			if _, err := os.Stat(p); err == nil {
				return "", "", fmt.Errorf("%s exists: refusing to overwrite a key (use --force)", p)
			}
		}
	}
	kb, err := cosign.GenerateKeyPair(pass)
	if err != nil {
		return "", "", err
	}
	// WriteFile keeps the mode of a file it overwrites; a private key must not stay readable by others.
	for _, p := range []string{keyPath, pubPath} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", "", err
		}
	}
	if err := os.WriteFile(keyPath, kb.PrivateBytes, 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(pubPath, kb.PublicBytes, 0o644); err != nil {
		return "", "", err
	}
	return keyPath, pubPath, nil
}
