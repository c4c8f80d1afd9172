package cachebackend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/archive"
	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/cache"
	"github.com/modelpack/modelpack/csidriver"
	"github.com/modelpack/modelpack/internal/testenv"
)

func TestClassifyMapsCausesToDriverErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{fmt.Errorf("resolve: %w", remote.ErrUnauthorized), csidriver.ErrUnauthorized},
		{fmt.Errorf("resolve: %w", remote.ErrForbidden), csidriver.ErrForbidden},
		{fmt.Errorf("fetch: %w", remote.ErrNotFound), csidriver.ErrNotFound},
		{fmt.Errorf("fetch: %w", remote.ErrUnavailable), csidriver.ErrUnavailable},
		{fmt.Errorf("fetch: %w", remote.ErrTLS), csidriver.ErrUnavailable},
		{&os.PathError{Op: "write", Path: "/cache/ingest/x", Err: syscall.ENOSPC}, csidriver.ErrNoSpace},
		{fmt.Errorf("layer: %w", cache.ErrTooLarge), csidriver.ErrUnsupported},
		{fmt.Errorf("layer: %w", cache.ErrUnsupported), csidriver.ErrUnsupported},
		{fmt.Errorf("acquire: %w", cache.ErrNotFound), csidriver.ErrNotFound},
		// Hostile or corrupt content is the artifact's fault (FAILED_PRECONDITION), never INTERNAL.
		{fmt.Errorf("extract layer: %w", archive.ErrUnsafePath), csidriver.ErrBadContent},
		{fmt.Errorf("extract layer: %w", archive.ErrLinkEscape), csidriver.ErrBadContent},
		{fmt.Errorf("extract layer: %w", archive.ErrSpecialFile), csidriver.ErrBadContent},
		{fmt.Errorf("manifest: %w: %w", cache.ErrUnsupported, artifact.ErrPathConflict), csidriver.ErrBadContent},
		{fmt.Errorf("layer: %w", cache.ErrDigestMismatch), csidriver.ErrBadContent},
		{fmt.Errorf("layer: %w", cache.ErrSizeMismatch), csidriver.ErrBadContent},
		{&remote.Error{Kind: remote.ErrSizeMismatch, Err: errors.New("GET: size mismatch")}, csidriver.ErrBadContent},
		{fmt.Errorf("extract layer: %w", archive.ErrTooLarge), csidriver.ErrUnsupported},
	} {
		got := classify(tc.err)
		if !errors.Is(got, tc.want) {
			t.Errorf("classify(%v) = %v, want %v", tc.err, got, tc.want)
		}
		if !errors.Is(got, tc.err) && !errors.Is(got, errors.Unwrap(tc.err)) {
			t.Errorf("classify(%v) lost the cause", tc.err)
		}
	}
	plain := errors.New("something else")
	if got := classify(plain); got != plain {
		t.Errorf("classify of an unknown error = %v, want it unchanged", got)
	}
	if classify(nil) != nil {
		t.Error("classify(nil) != nil")
	}
}

func TestBadPullSecretIsUnauthenticatedWithoutEchoingIt(t *testing.T) {
	b := New(nil, Options{})
	_, _, err := b.repository("registry.example.com/m:v1", csidriver.Credentials{DockerConfigJSON: []byte(`{"auths": "hunter2`)})
	if !errors.Is(err, csidriver.ErrUnauthorized) {
		t.Fatalf("got %v, want ErrUnauthorized", err)
	}
	if err != nil && strings.Contains(err.Error(), "hunter2") {
		t.Fatal("the error quotes the secret")
	}
}

func TestVerifyChecksTheDigestReferenceWithTheVolumeCredentials(t *testing.T) {
	var asked string
	var creds auth.CredentialFunc
	denied := fmt.Errorf("%w: no signature by a trusted key", csidriver.ErrDenied)
	b := New(nil, Options{Verifier: VerifierFunc(func(ctx context.Context, ref string) error {
		asked, creds = ref, remote.CredentialFrom(ctx)
		return denied
	})})
	const dgst = "sha256:4f0e12ac55ad1fb2c4d5a9b9bd9b4c4d1b2a7ef1b1a3c6a26b3f2e2a9d0c1e2f"
	secret := csidriver.Credentials{DockerConfigJSON: []byte(`{"auths":{"registry.example.com":{"auth":"dTpw"}}}`)}
	err := b.Verify(context.Background(), "registry.example.com/models/llama:v1", dgst, secret)
	if !errors.Is(err, csidriver.ErrDenied) {
		t.Fatalf("got %v, want the denial", err)
	}
	if asked != "registry.example.com/models/llama@"+dgst {
		t.Fatalf("verified %q, want the digest reference", asked)
	}
	if creds == nil {
		t.Fatal("the verifier did not get the volume's credentials")
	}
	c, err := creds(context.Background(), "registry.example.com")
	if err != nil || c.Username != "u" || c.Password != "p" {
		t.Fatalf("credentials %+v, %v; want u/p from the secret", c, err)
	}
	if err := New(nil, Options{}).Verify(context.Background(), "registry.example.com/m:v1", dgst, csidriver.Credentials{}); err != nil {
		t.Fatalf("without a verifier: %v", err)
	}
}

// The driver's TLS errors name its own flags, never the CLI's --insecure or --plain-http.
func TestTLSErrorsNameTheDriversFlags(t *testing.T) {
	tlsSrv := httptest.NewTLSServer(http.NotFoundHandler())
	defer tlsSrv.Close()
	plainSrv := httptest.NewServer(http.NotFoundHandler())
	defer plainSrv.Close()
	b := New(nil, Options{})
	for _, tc := range []struct {
		name, host, want string
	}{
		{"untrusted certificate", strings.TrimPrefix(tlsSrv.URL, "https://"), "--ca-file"},
		{"plain HTTP server", strings.TrimPrefix(plainSrv.URL, "http://"), "--plain-http-registries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.Resolve(context.Background(), tc.host+"/m:v1", csidriver.Credentials{})
			if !errors.Is(err, csidriver.ErrUnavailable) {
				t.Fatalf("got %v, want ErrUnavailable", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) {
				t.Errorf("%q does not name %s", msg, tc.want)
			}
			for _, cli := range []string{"--insecure", "--plain-http)", "use --plain-http"} {
				if strings.Contains(msg, cli) {
					t.Errorf("%q names the CLI's %s, which the driver lacks", msg, cli)
				}
			}
		})
	}
	if !strings.Contains(DriverHints.TLS, "--hosts-dir") {
		t.Errorf("the TLS hint %q does not mention --hosts-dir", DriverHints.TLS)
	}
}

// A credential is known by what it presents to the host: the same user and password in two secrets is one
// credential, a rotated password another, and a secret without an entry for the host presents the node's.
func TestVolumeAndNodeCredentials(t *testing.T) {
	ctx := context.Background()
	cfg := func(host, user, pass string) csidriver.Credentials {
		return csidriver.Credentials{DockerConfigJSON: []byte(testenv.DockerConfigJSON(host, user, pass))}
	}
	nodeCfg := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(nodeCfg, []byte(`{"auths":{"node.example":{"auth":"bjpw"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	b := New(nil, Options{Remote: remote.Options{RegistryConfig: nodeCfg}})
	get := func(c csidriver.Credentials, host string) []byte {
		t.Helper()
		m, err := b.VolumeCredential(ctx, host, c)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a := get(cfg("r.example", "alice", "pw1"), "r.example")
	if a == nil || !bytes.Equal(a, get(cfg("r.example", "alice", "pw1"), "r.example")) {
		t.Fatalf("one credential gave %q and another value", a)
	}
	if bytes.Equal(a, get(cfg("r.example", "alice", "pw2"), "r.example")) {
		t.Fatal("a rotated password presents the same credential")
	}
	if bytes.Equal(a, get(cfg("r.example", "alic", "epw1"), "r.example")) {
		t.Fatal("user and password are not kept apart")
	}
	if m := get(cfg("other.example", "alice", "pw1"), "r.example"); m != nil {
		t.Fatalf("a secret without an entry for the host presents %q", m)
	}
	if m := get(csidriver.Credentials{}, "r.example"); m != nil {
		t.Fatalf("no secret presents %q", m)
	}
	for host, want := range map[string]bool{"node.example": true, "r.example": false} {
		if got, err := b.NodeCredential(ctx, host); err != nil || got != want {
			t.Errorf("NodeCredential(%s) = %v, %v; want %v", host, got, err, want)
		}
	}
	if _, err := b.VolumeCredential(ctx, "r.example", csidriver.Credentials{DockerConfigJSON: []byte(`{"auths": "x`)}); !errors.Is(err, csidriver.ErrUnauthorized) {
		t.Fatalf("a secret that is not a docker config: %v, want ErrUnauthorized", err)
	}
}
