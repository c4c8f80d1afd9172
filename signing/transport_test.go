package signing

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

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
