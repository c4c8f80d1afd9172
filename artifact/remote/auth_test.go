package remote

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelpack/modelpack/internal/testenv"
	"golang.org/x/crypto/bcrypt"
	"oras.land/oras-go/v2/registry/remote/auth"
)

func htpasswd(t testing.TB, user, pass string) string {
	h, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return user + ":" + string(h) + "\n"
}

func TestBasicAuthWithLogin(t *testing.T) {
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: htpasswd(t, "alice", "s3cret")})
	cfg := filepath.Join(t.TempDir(), "config.json")
	opts := Options{PlainHTTP: true, RegistryConfig: cfg}
	m := buildModel(t, 256<<10)

	_, err := Push(ctx, m.store, m.ref, repoFor(t, reg.Host+"/team/model:v1", opts), TransferOptions{})
	if Classify(err) != ErrUnauthorized || !strings.Contains(err.Error(), "modelpack login "+reg.Host) {
		t.Fatalf("push without credentials: %v, want unauthorized suggesting modelpack login", err)
	}
	if err := Login(ctx, reg.Host, auth.Credential{Username: "alice", Password: "wrong"}, opts); Classify(err) != ErrUnauthorized {
		t.Fatalf("login with a wrong password: %v, want unauthorized", err)
	}
	if _, err := os.Stat(cfg); err == nil {
		b, _ := os.ReadFile(cfg)
		if strings.Contains(string(b), reg.Host) {
			t.Fatalf("a rejected login was saved: %s", b)
		}
	}
	if err := Login(ctx, reg.Host, auth.Credential{Username: "alice", Password: "s3cret"}, opts); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(cfg)
	if err != nil || !strings.Contains(string(b), reg.Host) {
		t.Fatalf("config after login: %s (%v)", b, err)
	}
	if _, err := Push(ctx, m.store, m.ref, repoFor(t, reg.Host+"/team/model:v1", opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := Fetch(ctx, repoFor(t, reg.Host+"/team/model:v1", opts), dir, FetchOptions{}); err != nil {
		t.Fatal(err)
	}
	m.checkFiles(t, dir)

	// Credentials from a dockerconfigjson secret take precedence and need no config file.
	secret, _ := json.Marshal(map[string]any{"auths": map[string]any{reg.Host: map[string]string{"username": "alice", "password": "s3cret"}}})
	cred, err := CredentialsFromDockerConfigJSON(secret)
	if err != nil {
		t.Fatal(err)
	}
	secretOpts := Options{PlainHTTP: true, RegistryConfig: filepath.Join(t.TempDir(), "none.json"), Credential: cred}
	if _, err := Fetch(ctx, repoFor(t, reg.Host+"/team/model:v1", secretOpts), t.TempDir(), FetchOptions{}); err != nil {
		t.Fatalf("fetch with secret credentials: %v", err)
	}

	if _, err := Logout(ctx, reg.Host, opts); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(cfg)
	if strings.Contains(string(b), reg.Host) {
		t.Fatalf("config after logout still has the registry: %s", b)
	}
	_, err = Fetch(ctx, repoFor(t, reg.Host+"/team/model:v1", opts), t.TempDir(), FetchOptions{})
	if Classify(err) != ErrUnauthorized {
		t.Fatalf("fetch after logout: %v, want unauthorized", err)
	}
}

// A docker credential helper: get/store/erase against a JSON file next to it.
const helperScript = `#!/bin/sh
db="$(dirname "$0")/creds.json"
case "$1" in
store) cat > "$db" ;;
get) read server; if [ -s "$db" ]; then cat "$db"; else echo "credentials not found in native keychain"; exit 1; fi ;;
erase) rm -f "$db" ;;
list) echo '{}' ;;
esac
`

func TestBasicAuthWithCredentialHelper(t *testing.T) {
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: htpasswd(t, "bob", "hunter2")})
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "docker-credential-test"), []byte(helperScript), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	cfg := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfg, []byte(`{"credHelpers":{"`+reg.Host+`":"test"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := Options{PlainHTTP: true, RegistryConfig: cfg}
	if err := Login(ctx, reg.Host, auth.Credential{Username: "bob", Password: "hunter2"}, opts); err != nil {
		t.Fatal(err)
	}
	stored, err := os.ReadFile(filepath.Join(bin, "creds.json"))
	if err != nil || !strings.Contains(string(stored), "hunter2") {
		t.Fatalf("the helper did not receive the credential: %s (%v)", stored, err)
	}
	if b, _ := os.ReadFile(cfg); strings.Contains(string(b), "hunter2") || strings.Contains(string(b), "auth\"") {
		t.Fatalf("the password was written to the config despite the helper: %s", b)
	}
	m := buildModel(t, 128<<10)
	if _, err := Push(ctx, m.store, m.ref, repoFor(t, reg.Host+"/h/model:v1", opts), TransferOptions{}); err != nil {
		t.Fatalf("push with helper credentials: %v", err)
	}
	if _, err := Logout(ctx, reg.Host, opts); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(bin, "creds.json")); !os.IsNotExist(err) {
		t.Fatalf("logout did not erase the helper's credential: %v", err)
	}
}

func TestTLSVerifiedWithGeneratedCA(t *testing.T) {
	ctx := context.Background()
	caFile, certFile, keyFile := testenv.WriteCA(t)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{CertFile: certFile, KeyFile: keyFile})
	cfg := filepath.Join(t.TempDir(), "config.json")
	m := buildModel(t, 256<<10)

	// Without the CA the certificate is refused.
	_, err := Push(ctx, m.store, m.ref, repoFor(t, reg.Host+"/tls/model:v1", Options{RegistryConfig: cfg}), TransferOptions{})
	if Classify(err) != ErrTLS || !strings.Contains(err.Error(), "--ca-file") {
		t.Fatalf("push to an untrusted registry: %v, want a TLS error suggesting --ca-file", err)
	}
	// With the CA it is verified.
	withCA := Options{RegistryConfig: cfg, CAFile: caFile}
	if _, err := Push(ctx, m.store, m.ref, repoFor(t, reg.Host+"/tls/model:v1", withCA), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := Fetch(ctx, repoFor(t, reg.Host+"/tls/model:v1", withCA), dir, FetchOptions{}); err != nil {
		t.Fatal(err)
	}
	m.checkFiles(t, dir)
	// --insecure skips verification.
	if _, err := Fetch(ctx, repoFor(t, reg.Host+"/tls/model:v1", Options{RegistryConfig: cfg, Insecure: true}), t.TempDir(), FetchOptions{}); err != nil {
		t.Fatalf("fetch with --insecure: %v", err)
	}
	// A self-signed certificate is refused too.
	ssCert, ssKey := selfSigned(t)
	caOnly := testenv.StartRegistry(t, testenv.RegistryOptions{CertFile: ssCert, KeyFile: ssKey})
	_, err = Fetch(ctx, repoFor(t, caOnly.Host+"/tls/model:v1", Options{RegistryConfig: cfg}), t.TempDir(), FetchOptions{})
	if Classify(err) != ErrTLS {
		t.Fatalf("fetch from a self-signed registry: %v, want ErrTLS", err)
	}
}

// selfSigned writes a self-signed server certificate for 127.0.0.1.
func selfSigned(t testing.TB) (certFile, keyFile string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "ss.pem"), filepath.Join(dir, "ss.key")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	return certFile, keyFile
}
