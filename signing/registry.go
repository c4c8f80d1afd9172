package signing

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"slices"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	ociremote "github.com/sigstore/cosign/v2/pkg/oci/remote"
	"oras.land/oras-go/v2/registry/remote/auth"

	mpremote "github.com/modelpack/modelpack/artifact/remote"
)

// RegistryOptions say how to reach registries. They mirror the transport's flags so one set of options serves
// pull, sign and verify.
type RegistryOptions struct {
	PlainHTTP bool // speak http:// (loopback registries are spoken to in http either way)
	// PlainHTTPHosts are the registries (host[:port]) spoken to in http:// when PlainHTTP is false: a node
	// reaches most registries over TLS and a few in-cluster ones without.
	PlainHTTPHosts []string
	Insecure       bool   // skip TLS certificate verification
	CAFile         string // PEM bundle of extra CAs for registry TLS
	// Credentials resolves a registry host:port to credentials, as oras-go's auth.Client does; nil is anonymous.
	Credentials auth.CredentialFunc
	// Transport, if set, is the base transport and the TLS fields above are ignored.
	Transport http.RoundTripper
	// TransportFor, if set, gives the transport of each registry host and wins over Transport and the TLS
	// fields: artifact/remote's TransportsFor, so signatures travel as the model does (TLS settings, hosts.toml,
	// plain HTTP only where configured, never a fallback from https to http). Verify's reads are then
	// authenticated by that transport, with its credentials (artifact/remote's Options and WithCredential), not
	// with Credentials.
	TransportFor func(host string) (http.RoundTripper, error)
}

// client is what cosign's remote package needs for one call.
type client struct {
	name   []name.Option
	oci    []ociremote.Option
	remote []remote.Option // the same, for go-containerregistry's own calls (OMS reads the manifest and blobs)
}

// transport is the base transport of registries reached without TransportFor. Whichever it is, documents
// (signature manifests, referrers lists) are held to artifact's limits, not go-containerregistry's 100 MiB.
func (o RegistryOptions) transport() (http.RoundTripper, error) {
	t, err := o.baseTransport()
	if err != nil {
		return nil, err
	}
	return mpremote.LimitDocuments(t), nil
}

func (o RegistryOptions) baseTransport() (http.RoundTripper, error) {
	if o.Transport != nil {
		return o.Transport, nil
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	if o.Insecure || o.CAFile != "" {
		cfg := &tls.Config{InsecureSkipVerify: o.Insecure} //nolint:gosec // asked for with --insecure
		if o.CAFile != "" {
			pem, err := os.ReadFile(o.CAFile)
			if err != nil {
				return nil, fmt.Errorf("registry CA: %w", err)
			}
			pool, err := x509.SystemCertPool()
			if err != nil {
				pool = x509.NewCertPool()
			}
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("registry CA: no PEM certificate in %s", o.CAFile)
			}
			cfg.RootCAs = pool
		}
		t.TLSClientConfig = cfg
	}
	return t, nil
}

// client is what cosign needs to reach ref's registry.
func (o RegistryOptions) client(ctx context.Context, base http.RoundTripper, ref string) client {
	return o.newClient(ctx, base, ref, false)
}

// readClient is client for reads only. With TransportFor, whose transports authenticate reads themselves,
// go-containerregistry is told the transport is authenticated already, so that it reads as the model's pull does:
// without its API ping (GET /v2/ to the origin before every operation, which an origin that hangs answers only
// at the response-header timeout, however many mirrors serve the reads) and without its retries on top of the
// transport's. Writes keep go-containerregistry's handshake, which authenticates uploads the transport could not
// replay.
func (o RegistryOptions) readClient(ctx context.Context, base http.RoundTripper, ref string) client {
	return o.newClient(ctx, base, ref, o.TransportFor != nil)
}

func (o RegistryOptions) newClient(ctx context.Context, base http.RoundTripper, ref string, authenticated bool) client {
	creds := o.Credentials
	// A request's own credentials (artifact/remote's WithCredential: a volume's pull secret) win.
	if c := mpremote.CredentialFrom(ctx); c != nil {
		creds = c
	}
	var kc authn.Keychain = credKeychain{ctx: ctx, f: creds}
	if creds == nil || authenticated {
		kc = authn.NewMultiKeychain() // anonymous
	}
	nameOpts := o.nameOptions(ref)
	if o.TransportFor != nil {
		base = failingTransport{fmt.Errorf("registry of %q: not a valid reference", ref)}
		if r, err := name.ParseReference(ref, nameOpts...); err == nil {
			if t, err := o.TransportFor(r.Context().RegistryStr()); err != nil {
				base = failingTransport{err}
			} else if !authenticated {
				base = t
			} else if base, err = transport.NewWithContext(ctx, r.Context().Registry, authn.Anonymous, pingAnswered{t}, nil); err != nil {
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
		name:   nameOpts,
		oci:    []ociremote.Option{ociremote.WithNameOptions(nameOpts...), ociremote.WithRemoteOptions(ro...)},
		remote: ro,
	}
}

func (o RegistryOptions) nameOptions(ref string) []name.Option {
	if o.PlainHTTP {
		return []name.Option{name.Insecure}
	}
	if len(o.PlainHTTPHosts) > 0 {
		if r, err := name.ParseReference(ref); err == nil && slices.Contains(o.PlainHTTPHosts, r.Context().RegistryStr()) {
			return []name.Option{name.Insecure}
		}
	}
	return nil
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

// credKeychain serves go-containerregistry from an oras-go credential function.
type credKeychain struct {
	ctx context.Context
	f   auth.CredentialFunc
}

func (k credKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	host := r.RegistryStr()
	if host == name.DefaultRegistry {
		host = "registry-1.docker.io" // the host oras-go asks credentials for
	}
	c, err := k.f(k.ctx, host)
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
