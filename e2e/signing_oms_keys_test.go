package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/signing/signingtest"
)

// TestSigningOMSPlainPEMKeys signs with the keys model_signing itself uses, plain PEM ECDSA keys made by openssl:
// PKCS#8 (openssl genpkey) and SEC1 with its EC PARAMETERS block (openssl ecparam -genkey), on P-256 and P-384.
// The modelpack CLI signs an artifact in a real registry (a referrer) and a model directory (model.sig) with
// each, never asking for a password, and verifies both with the public key openssl derived.
func TestSigningOMSPlainPEMKeys(t *testing.T) {
	e := newSigEnv(t)
	e.env = append(e.env, "MODELPACK_HOME="+filepath.Join(t.TempDir(), "store"))
	// No password anywhere: a plain key must not need one (and there is no terminal to ask on).
	kept := e.env[:0]
	for _, v := range e.env {
		if !strings.HasPrefix(v, "COSIGN_PASSWORD=") {
			kept = append(kept, v)
		}
	}
	e.env = kept
	for _, k := range []struct {
		name string
		gen  []string
	}{
		{"pkcs8-p384", []string{"genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:secp384r1", "-out", "pkcs8-p384.pem"}},
		{"sec1-p256", []string{"ecparam", "-name", "prime256v1", "-genkey", "-out", "sec1-p256.pem"}},
	} {
		t.Run(k.name, func(t *testing.T) {
			e := &sigEnv{t: t, mp: e.mp, oras: e.oras, host: e.host, dir: e.dir, env: e.env, reg: e.reg}
			e.must("openssl", k.gen...)
			key := k.name + ".pem"
			e.must("openssl", "pkey", "-in", key, "-pubout", "-out", k.name+".pub")
			ref, _ := e.push("oms/"+k.name, "v1", "weights signed with "+k.name)
			out := e.must(e.mp, "sign", ref, "--key", key, "--format", "oms", "--plain-http")
			if !strings.Contains(out, "referrer sha256:") {
				t.Fatalf("sign --format oms: %s", out)
			}
			e.must(e.mp, "verify", ref, "--format", "oms", "--key", k.name+".pub", "--plain-http")

			dir := filepath.Join(e.dir, "model-"+k.name)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			signingtest.WriteFile(t, dir, "model.safetensors", []byte("directory weights"))
			e.must(e.mp, "sign", "--oms", dir, "--key", key)
			e.must(e.mp, "verify", "--oms", dir, "--key", k.name+".pub")
			signingtest.WriteFile(t, dir, "model.safetensors", []byte("changed weights"))
			e.mustFail("model.safetensors", e.mp, "verify", "--oms", dir, "--key", k.name+".pub")
		})
	}
	e.must("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-aes256", "-pass", "pass:pw", "-out", "encrypted.pem")
	ref, _ := e.push("oms/encrypted", "v1", "weights")
	e.mustFail("encrypted PKCS#8 key", e.mp, "sign", ref, "--key", "encrypted.pem", "--format", "oms", "--plain-http")
}
