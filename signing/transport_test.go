package signing

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"

	mpremote "github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/internal/testenv"
)

// Signatures travel the model's transport: what a signature read reaches is decided by artifact/remote's
// settings (TLS by default, a CA from --ca-file or hosts.toml, a hosts.toml server, plain HTTP only when listed),
// and go-containerregistry's fallback from https to http for private addresses never happens.
func TestSignatureReadsUseTheModelTransport(t *testing.T) {
	manifest := func(h *testenv.HostileRegistry) string {
		h.Manifest(t, "v1", ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest}, ocispec.MediaTypeImageManifest)
		return h.Host + "/m:v1" // a tag: resolving it asks the registry
	}
	resolveWith := func(ref string, o mpremote.Options, plain []string) error {
		o.PlainHTTPHosts = plain
		_, err := resolve(ref, writeClient(context.Background(), transports(t, o), ref))
		return err
	}

	t.Run("no fallback to plain HTTP for an unlisted private registry", func(t *testing.T) {
		h := testenv.StartHostileRegistry(t)
		ref := manifest(h)
		if err := resolveWith(ref, mpremote.Options{}, nil); err == nil {
			t.Fatal("a plain-HTTP registry that is not listed was reached")
		}
		if n := h.Requests(); n != 0 {
			t.Fatalf("the unlisted plain-HTTP registry answered %d requests", n)
		}
	})
	t.Run("plain HTTP for a listed registry", func(t *testing.T) {
		h := testenv.StartHostileRegistry(t)
		if err := resolveWith(manifest(h), mpremote.Options{}, []string{h.Host}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("TLS verified by default, trusted with the CA file", func(t *testing.T) {
		h, ca := testenv.StartHostileRegistryTLS(t)
		ref := manifest(h)
		if err := resolveWith(ref, mpremote.Options{}, nil); err == nil {
			t.Fatal("an untrusted certificate was accepted")
		}
		if err := resolveWith(ref, mpremote.Options{CAFile: ca}, nil); err != nil {
			t.Fatalf("with --ca-file: %v", err)
		}
	})
	t.Run("hosts.toml: server and CA", func(t *testing.T) {
		h, ca := testenv.StartHostileRegistryTLS(t)
		ref := manifest(h)
		// The model is named by an alias; hosts.toml sends it to the real server and trusts its CA.
		alias := "models.example.internal"
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, alias), 0o755); err != nil {
			t.Fatal(err)
		}
		toml := "server = \"https://" + h.Host + "\"\nca = \"" + ca + "\"\n"
		if err := os.WriteFile(filepath.Join(dir, alias, "hosts.toml"), []byte(toml), 0o644); err != nil {
			t.Fatal(err)
		}
		aliased := alias + ref[len(h.Host):]
		if err := resolveWith(aliased, mpremote.Options{HostsDir: dir}, nil); err != nil {
			t.Fatalf("through hosts.toml: %v", err)
		}
	})
}

// Signatures are read through hosts.toml mirrors as the model is: mirrors first, in file order, then the origin.
// A node whose origin is down verifies a model its mirror serves with its signature; a mirror without the
// signature falls back to the origin, and with the origin down too the model is refused, never passed unverified.
func TestSignatureReadsFollowMirrors(t *testing.T) {
	ctx := context.Background()
	origin := testenv.StartRegistry(t, testenv.RegistryOptions{})
	mirror := startRegistry(t)
	dir := t.TempDir()
	key, pub := newKeys(t, dir, "k")
	signed := sign(t, func() string { r, _ := pushModel(t, origin.Host, "models/m", "v1", "mirrored"); return r }(), key)
	unsigned, _ := pushModel(t, origin.Host, "models/m", "v2", "not on the mirror's signature")
	sigOnlyAtOrigin := sign(t, unsigned, key)

	// The mirror holds both models, but the signature of the first only.
	for _, ref := range []string{signed, sigOnlyAtOrigin, signatureTag(t, signed)} {
		copyToMirror(t, mirror, ref, nil)
	}

	hosts := mirrorHosts(t, origin.Host, "[host.\"http://"+mirror+"\"]\n  capabilities = [\"pull\", \"resolve\"]\n")
	plain := []string{origin.Host}
	v := NewVerifier(keyPolicy(t, Enforce, pub), transports(t, listed(mpremote.Options{HostsDir: hosts}, plain)))

	// With the origin up, a mirror lacking the signature is a miss and the origin serves it.
	if dec, err := v.Verify(ctx, sigOnlyAtOrigin); err != nil || !dec.Verified {
		t.Fatalf("signature only at the origin: %+v, %v", dec, err)
	}

	origin.Stop()
	if dec, err := v.Verify(ctx, signed); err != nil || !dec.Verified {
		t.Fatalf("origin down, mirror serving model and signature: %+v, %v", dec, err)
	}
	// A fresh verifier (no cached verdict): the signature is on neither reachable endpoint.
	v2 := NewVerifier(keyPolicy(t, Enforce, pub), transports(t, listed(mpremote.Options{HostsDir: hosts}, plain)))
	if dec, err := v2.Verify(ctx, sigOnlyAtOrigin); err == nil || dec.Verified {
		t.Fatalf("origin down, mirror without the signature: verified (%+v)", dec)
	} else {
		t.Logf("refused: %v", err)
	}
}

// signatureTag is cosign's signature tag of a digest reference: repo:sha256-<hex>.sig.
func signatureTag(t *testing.T, digestRef string) string {
	t.Helper()
	repo, dgst, ok := strings.Cut(digestRef, "@")
	if !ok {
		t.Fatalf("not a digest reference: %s", digestRef)
	}
	return repo + ":" + strings.Replace(dgst, ":", "-", 1) + ".sig"
}

// mirrorHosts writes a hosts directory whose hosts.toml for origin is body.
func mirrorHosts(t *testing.T, origin, body string) string {
	t.Helper()
	hosts := t.TempDir()
	if err := os.MkdirAll(filepath.Join(hosts, origin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hosts, origin, "hosts.toml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return hosts
}

// copyToMirror copies ref (origin/repo:tag or @digest) to the same repository and tag on mirror, with the mirror's
// credentials if cred is set.
func copyToMirror(t *testing.T, mirror, ref string, cred auth.CredentialFunc) {
	t.Helper()
	src, err := remote.NewRepository(ref)
	if err != nil {
		t.Fatal(err)
	}
	src.PlainHTTP = true
	dst, err := remote.NewRepository(mirror + "/" + src.Reference.Repository)
	if err != nil {
		t.Fatal(err)
	}
	dst.PlainHTTP = true
	if cred != nil {
		dst.Client = &auth.Client{Credential: cred}
	}
	tag := src.Reference.Reference
	if _, err := oras.Copy(context.Background(), src, tag, dst, tag, oras.DefaultCopyOptions); err != nil {
		t.Fatalf("copy %s to %s: %v", ref, mirror, err)
	}
}

// A mirror that wants credentials gets the volume's (the driver passes them with the call), as the model's pull
// does; without them it is a miss, and with the origin down the model is refused.
func TestSignatureReadsFromAPrivateMirror(t *testing.T) {
	ctx := context.Background()
	origin := testenv.StartRegistry(t, testenv.RegistryOptions{})
	mirror, good := startPrivateRegistry(t)
	key, pub := newKeys(t, t.TempDir(), "k")
	ref, _ := pushModel(t, origin.Host, "models/p", "v1", "private mirror")
	signed := sign(t, ref, key)
	for _, r := range []string{signed, signatureTag(t, signed)} {
		copyToMirror(t, mirror, r, good)
	}
	hosts := mirrorHosts(t, origin.Host, "[host.\"http://"+mirror+"\"]\n")
	origin.Stop()
	plain := []string{origin.Host}
	verifier := func() *Verifier {
		return NewVerifier(keyPolicy(t, Enforce, pub), transports(t, listed(mpremote.Options{HostsDir: hosts,
			RegistryConfig: filepath.Join(t.TempDir(), "config.json")}, plain)))
	}
	if dec, err := verifier().Verify(ctx, signed); err == nil || dec.Verified {
		t.Fatalf("a private mirror was read without credentials: %+v", dec)
	}
	withCreds := mpremote.WithCredential(ctx, good)
	if dec, err := verifier().Verify(withCreds, signed); err != nil || !dec.Verified {
		t.Fatalf("private mirror with the volume's credentials: %+v, %v", dec, err)
	}
}

// hungOriginVerifier returns a factory of the verifier the driver would build for models named on origin, with
// hostsBody as origin's hosts.toml and waits bounded by a small ResponseHeader, so that a request a hung server does
// receive fails fast.
func hungOriginVerifier(t *testing.T, origin, hostsBody, pub string) func() *Verifier {
	t.Helper()
	hosts := mirrorHosts(t, origin, hostsBody)
	plain := []string{origin}
	opts := mpremote.Options{HostsDir: hosts, RegistryConfig: filepath.Join(t.TempDir(), "config.json"),
		Timeouts: mpremote.Timeouts{ResponseHeader: time.Second, Idle: time.Second}}
	return func() *Verifier {
		return NewVerifier(keyPolicy(t, Enforce, pub), transports(t, listed(opts, plain)))
	}
}

// A signature check behaves like the model's pull against an origin that hangs (accepts TCP, never answers): with
// a mirror serving the model's signature, the origin receives nothing at all — go-containerregistry's API ping
// (GET /v2/ before each operation) does not happen, since the transport already knows the endpoint and
// authenticates reads itself. A signature the mirror lacks is asked of the origin once, bounded by the configured
// timeout, and the model is refused with an error naming it.
func TestSignatureChecksNeverWaitOnAHungOrigin(t *testing.T) {
	ctx := context.Background()
	source := startRegistry(t)
	mirror := startRegistry(t)
	hung := testenv.StartHungServer(t)
	key, pub := newKeys(t, t.TempDir(), "k")
	model, _ := pushModel(t, source, "models/m", "v1", "behind a hung origin")
	signed := sign(t, model, key)
	unsigned, _ := pushModel(t, source, "models/m", "v2", "signed nowhere")
	for _, ref := range []string{signed, signatureTag(t, signed), unsigned} {
		copyToMirror(t, mirror, ref, nil)
	}
	onHung := func(ref string) string { return hung.Host + strings.TrimPrefix(ref, source) }
	verifier := hungOriginVerifier(t, hung.Host, "[host.\"http://"+mirror+"\"]\n  capabilities = [\"pull\", \"resolve\"]\n", pub)

	if dec, err := verifier().Verify(ctx, onHung(signed)); err != nil || !dec.Verified {
		t.Fatalf("mirror serving model and signature, origin hung: %+v, %v", dec, err)
	}
	if n, b := hung.Accepted(), hung.BytesRead(); n != 0 || b != 0 {
		t.Fatalf("the hung origin received %d connection(s), %d byte(s); want none", n, b)
	}

	ref := onHung(unsigned)
	dec, err := verifier().Verify(ctx, ref)
	if err == nil || dec.Verified || !strings.Contains(err.Error(), ref) {
		t.Fatalf("signature on no reachable endpoint: %+v, %v; want an error naming %s", dec, err, ref)
	}
	t.Logf("refused: %v", err)
	if n := hung.Accepted(); n != 1 {
		t.Fatalf("the hung origin received %d connection(s); want one request, abandoned at the response-header timeout and not retried", n)
	}
}

// A mirror that hangs while the origin works costs each read one response-header timeout, as in the pull, and the
// origin serves the signature.
func TestSignatureChecksPassAHungMirror(t *testing.T) {
	origin := startRegistry(t)
	hung := testenv.StartHungServer(t)
	key, pub := newKeys(t, t.TempDir(), "k")
	model, _ := pushModel(t, origin, "models/m", "v1", "behind a hung mirror")
	signed := sign(t, model, key)
	verifier := hungOriginVerifier(t, origin, "[host.\"http://"+hung.Host+"\"]\n  capabilities = [\"pull\", \"resolve\"]\n", pub)
	if dec, err := verifier().Verify(context.Background(), signed); err != nil || !dec.Verified {
		t.Fatalf("origin serving the signature, mirror hung: %+v, %v", dec, err)
	}
	if hung.Accepted() == 0 {
		t.Fatal("the mirror was not tried first")
	}
}

// Reads from a private origin are authenticated by the transport, with the credentials the model's pull uses (the
// volume's, passed with the call), since the check does not ping the registry for a challenge; signing, a write,
// keeps go-containerregistry's handshake through the same transport.
func TestSignatureReadsFromAPrivateOrigin(t *testing.T) {
	ctx := context.Background()
	origin, good := startPrivateRegistry(t)
	ref := pushPrivateModel(t, origin, "models/private", good, "private origin")
	key, pub := newKeys(t, t.TempDir(), "k")
	plain := []string{origin}
	noConfig := filepath.Join(t.TempDir(), "config.json")
	signed, err := SignDigest(ctx, ref, key, SignOptions{Password: testPass, Registry: transports(t, mpremote.Options{RegistryConfig: noConfig, Credential: good, PlainHTTPHosts: plain})})
	if err != nil {
		t.Fatal(err)
	}
	v := NewVerifier(keyPolicy(t, Enforce, pub), transports(t, listed(mpremote.Options{RegistryConfig: noConfig}, plain)))
	if dec, err := v.Verify(ctx, signed); err == nil || errors.Is(err, ErrDenied) || dec.Verified {
		t.Fatalf("a private origin was read without credentials: %+v, %v", dec, err)
	}
	if dec, err := v.Verify(mpremote.WithCredential(ctx, good), signed); err != nil || !dec.Verified {
		t.Fatalf("private origin with the volume's credentials: %+v, %v", dec, err)
	}
}

// listed is o with the registries plain reached in plain HTTP.
func listed(o mpremote.Options, plain []string) mpremote.Options {
	o.PlainHTTPHosts = plain
	return o
}
