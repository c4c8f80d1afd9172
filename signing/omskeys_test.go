package signing

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/signing/oms"
)

// model_signing signs with plain PEM ECDSA keys; OMS signing takes them as openssl and Go write them (SEC1 and
// PKCS#8, with or without openssl's EC PARAMETERS block), never asking for a password, and the signature
// verifies with the matching public key on each curve OMS supports. Keys OMS cannot use are refused by name.
func TestLoadOMSSignerKeyFormats(t *testing.T) {
	dir := t.TempDir()
	noPass := func(bool) ([]byte, error) { t.Fatal("a password was asked for a plain key"); return nil, nil }
	openssl := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("openssl", args...).CombinedOutput(); err != nil {
			t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	type key struct{ name, priv, pub string }
	var keys []key
	for _, c := range []struct{ name, curve string }{{"p256", "prime256v1"}, {"p384", "secp384r1"}, {"p521", "secp521r1"}} {
		sec1 := filepath.Join(dir, "openssl-sec1-"+c.name+".pem")
		openssl("ecparam", "-name", c.curve, "-genkey", "-out", sec1) // EC PARAMETERS, then EC PRIVATE KEY
		pkcs8 := filepath.Join(dir, "openssl-pkcs8-"+c.name+".pem")
		openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:"+c.curve, "-out", pkcs8)
		for _, k := range []string{sec1, pkcs8} {
			openssl("pkey", "-in", k, "-pubout", "-out", k+".pub")
			keys = append(keys, key{filepath.Base(k), k, k + ".pub"})
		}
	}
	for _, curve := range []elliptic.Curve{elliptic.P256(), elliptic.P384()} {
		k, err := ecdsa.GenerateKey(curve, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		sec1, _ := x509.MarshalECPrivateKey(k)
		pkcs8, _ := x509.MarshalPKCS8PrivateKey(k)
		pkix, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
		n := curve.Params().Name
		pub := writeFile(t, dir, "go-"+n+".pub", string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pkix})))
		keys = append(keys,
			key{"go-sec1-" + n, writeFile(t, dir, "go-sec1-"+n+".pem", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}))), pub},
			key{"go-pkcs8-" + n, writeFile(t, dir, "go-pkcs8-"+n+".pem", string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}))), pub})
	}
	st, err := oms.NewStatement("model", oms.Files{"model.safetensors": strings.Repeat("ab", 32)}, oms.DefaultIgnores)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		t.Run(k.name, func(t *testing.T) {
			signer, err := loadOMSSigner(k.priv, "", noPass)
			if err != nil {
				t.Fatal(err)
			}
			omsSignVerifies(t, signer, k.pub, st)
		})
	}
	// openssl ec -aes256 (RFC 1423, what Python's cryptography decrypts for model_signing) asks for the password.
	encSEC1 := filepath.Join(dir, "encrypted-sec1.pem")
	openssl("ec", "-in", keys[0].priv, "-aes256", "-passout", "pass:"+testPassword, "-out", encSEC1)
	if b, _ := os.ReadFile(encSEC1); !strings.Contains(string(b), "Proc-Type: 4,ENCRYPTED") {
		t.Fatalf("openssl did not encrypt the key: %s", b)
	}
	signer, err := loadOMSSigner(encSEC1, "", testPass)
	if err != nil {
		t.Fatalf("encrypted SEC1 key: %v", err)
	}
	omsSignVerifies(t, signer, keys[0].pub, st)
	wrongPass := func(bool) ([]byte, error) { return []byte("wrong"), nil }
	if _, err := loadOMSSigner(encSEC1, "", wrongPass); err == nil || !strings.Contains(err.Error(), encSEC1) {
		t.Fatalf("wrong password: %v", err)
	}
	// A cosign key still works, with its password.
	cosignKey, _ := newKeys(t, dir, "cosign")
	if _, err := loadOMSSigner(cosignKey, "", testPass); err != nil {
		t.Fatalf("cosign key: %v", err)
	}

	enc := filepath.Join(dir, "encrypted.pem")
	openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-aes256", "-pass", "pass:pw", "-out", enc)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	rsaDER, _ := x509.MarshalPKCS8PrivateKey(rsaKey)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	edDER, _ := x509.MarshalPKCS8PrivateKey(edKey)
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	p224DER, _ := x509.MarshalECPrivateKey(p224)
	for _, c := range []struct{ name, path, want string }{
		{"encrypted PKCS#8", enc, "encrypted PKCS#8 key (ENCRYPTED PRIVATE KEY) is not supported"},
		{"RSA", writeFile(t, dir, "rsa.pem", string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: rsaDER}))), "OMS signs with ECDSA keys only"},
		{"Ed25519", writeFile(t, dir, "ed.pem", string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: edDER}))), "OMS signs with ECDSA keys only"},
		{"P-224", writeFile(t, dir, "p224.pem", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: p224DER}))), "curve P-224"},
		{"not PEM", writeFile(t, dir, "junk.pem", "not a key"), "not a PEM private key"},
	} {
		_, err := loadOMSSigner(c.path, "", noPass)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.path) {
			t.Errorf("%s: error %v, want one naming %s and saying %q", c.name, err, c.path, c.want)
		}
	}
}

// omsSignVerifies signs st with signer and checks the bundle verifies with the public key at pubPath.
func omsSignVerifies(t *testing.T, signer crypto.Signer, pubPath string, st *oms.Statement) {
	t.Helper()
	bundle, err := oms.Sign(st, signer)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := os.ReadFile(pubPath)
	if err != nil {
		t.Fatal(err)
	}
	v, err := oms.NewKeyVerifier(pubPath, pub)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := oms.Parse(bundle)
	if err != nil {
		t.Fatal(err)
	}
	got, err := sig.Verify(v)
	if err != nil {
		t.Fatalf("the signature does not verify with %s: %v", pubPath, err)
	}
	if err := got.Check(oms.Files{"model.safetensors": strings.Repeat("ab", 32)}); err != nil {
		t.Fatal(err)
	}
}
