package signing

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/crypto/bcrypt"
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
		reg := RegistryOptions{PlainHTTPHosts: plain, TransportFor: mpremote.TransportsFor(o, plain)}
		_, err := resolve(ref, reg.client(context.Background(), nil, ref))
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
	v := NewVerifier(keyPolicy(t, Enforce, pub), RegistryOptions{PlainHTTPHosts: plain,
		TransportFor: mpremote.TransportsFor(mpremote.Options{HostsDir: hosts}, plain)})

	// With the origin up, a mirror lacking the signature is a miss and the origin serves it.
	if dec, err := v.Verify(ctx, sigOnlyAtOrigin); err != nil || !dec.Verified {
		t.Fatalf("signature only at the origin: %+v, %v", dec, err)
	}

	origin.Stop()
	if dec, err := v.Verify(ctx, signed); err != nil || !dec.Verified {
		t.Fatalf("origin down, mirror serving model and signature: %+v, %v", dec, err)
	}
	// A fresh verifier (no cached verdict): the signature is on neither reachable endpoint.
	v2 := NewVerifier(keyPolicy(t, Enforce, pub), RegistryOptions{PlainHTTPHosts: plain,
		TransportFor: mpremote.TransportsFor(mpremote.Options{HostsDir: hosts}, plain)})
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
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	origin := testenv.StartRegistry(t, testenv.RegistryOptions{})
	mirror := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: "puller:" + string(hash) + "\n"}).Host
	good := func(context.Context, string) (auth.Credential, error) {
		return auth.Credential{Username: "puller", Password: "s3cret"}, nil
	}
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
		return NewVerifier(keyPolicy(t, Enforce, pub), RegistryOptions{PlainHTTPHosts: plain,
			TransportFor: mpremote.TransportsFor(mpremote.Options{HostsDir: hosts,
				RegistryConfig: filepath.Join(t.TempDir(), "config.json")}, plain)})
	}
	if dec, err := verifier().Verify(ctx, signed); err == nil || dec.Verified {
		t.Fatalf("a private mirror was read without credentials: %+v", dec)
	}
	withCreds := mpremote.WithCredential(WithCredentials(ctx, good), good)
	if dec, err := verifier().Verify(withCreds, signed); err != nil || !dec.Verified {
		t.Fatalf("private mirror with the volume's credentials: %+v, %v", dec, err)
	}
}
