package signing

import (
	"context"
	"fmt"
	"net/http"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	ociremote "github.com/sigstore/cosign/v2/pkg/oci/remote"
	"oras.land/oras-go/v2/registry/remote/auth"

	mpremote "github.com/modelpack/modelpack/artifact/remote"
)

// This file adapts artifact/remote, the one registry layer, to cosign (go-containerregistry): every request goes
// out through the Transports' RoundTripper of its registry (TLS, hosts.toml, mirrors, plain HTTP only where
// configured) and writes authenticate with the Transports' credentials. Nothing here decides how a registry is
// reached.

// client is what cosign's remote package needs for one call.
type client struct {
	oci    []ociremote.Option
	remote []remote.Option // the same, for go-containerregistry's own calls (OMS reads the manifest and blobs)
}

// writeClient is what cosign needs to write to ref's registry: go-containerregistry's handshake (ping, challenge,
// token) through the registry's transport, with the Transports' credentials, since the transport could not replay
// an upload it authenticated itself.
func writeClient(ctx context.Context, reg *mpremote.Transports, ref string) client {
	return newClient(ctx, reg, ref, false)
}

// readClient is what cosign needs to read from ref's registry. The transport authenticates reads itself, so
// go-containerregistry is told it is authenticated already and reads as the model's pull does: without its API
// ping (GET /v2/ to the origin before every operation, which an origin that hangs answers only at the
// response-header timeout, however many mirrors serve the reads) and without its retries on top of the
// transport's.
func readClient(ctx context.Context, reg *mpremote.Transports, ref string) client {
	return newClient(ctx, reg, ref, true)
}

func newClient(ctx context.Context, reg *mpremote.Transports, ref string, read bool) client {
	var base http.RoundTripper = failingTransport{fmt.Errorf("registry of %q: not a valid reference", ref)}
	var kc authn.Keychain = authn.NewMultiKeychain() // anonymous
	if r, err := name.ParseReference(ref); err == nil {
		t, err := reg.For(r.Context().RegistryStr())
		switch {
		case err != nil:
			base = failingTransport{err}
		case !read:
			base, kc = t, credKeychain{ctx: ctx, reg: reg}
		default:
			if base, err = transport.NewWithContext(ctx, r.Context().Registry, authn.Anonymous, pingAnswered{t}, nil); err != nil {
				base = failingTransport{err}
			}
		}
	}
	ro := []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(base),
		remote.WithAuthFromKeychain(kc),
		remote.WithUserAgent("modelpack"),
	}
	return client{
		oci:    []ociremote.Option{ociremote.WithRemoteOptions(ro...)},
		remote: ro,
	}
}

// pingAnswered answers go-containerregistry's API ping itself: the one transport.NewWithContext makes to build a
// transport.Wrapper, the type go-containerregistry uses as is.
type pingAnswered struct{ http.RoundTripper }

func (p pingAnswered) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Path == "/v2/" {
		return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Header: http.Header{}, Body: http.NoBody, Request: req}, nil
	}
	return p.RoundTripper.RoundTrip(req)
}

// failingTransport fails every request with the error that kept a registry's transport from being built.
type failingTransport struct{ err error }

func (f failingTransport) RoundTrip(*http.Request) (*http.Response, error) { return nil, f.err }

// credKeychain serves go-containerregistry the credentials the Transports would present.
type credKeychain struct {
	ctx context.Context
	reg *mpremote.Transports
}

func (k credKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	host := r.RegistryStr()
	if host == name.DefaultRegistry {
		host = "registry-1.docker.io" // the host oras-go asks credentials for
	}
	c, err := k.reg.Credential(k.ctx, host)
	if err != nil {
		return nil, fmt.Errorf("credentials for %s: %w", host, err)
	}
	if c == auth.EmptyCredential {
		return authn.Anonymous, nil
	}
	return authn.FromConfig(authn.AuthConfig{
		Username: c.Username, Password: c.Password, IdentityToken: c.RefreshToken, RegistryToken: c.AccessToken,
	}), nil
}
