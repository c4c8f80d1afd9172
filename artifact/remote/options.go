package remote

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"time"

	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
	"oras.land/oras-go/v2/registry/remote/retry"

	"github.com/modelpack/modelpack/transfer"
)

// Options configure how registries are reached. The zero value verifies TLS, reads credentials from the docker
// config (and its credential helpers) and uses no mirrors.
type Options struct {
	// RegistryConfig is a docker config.json holding credentials; empty means docker's default
	// ($DOCKER_CONFIG/config.json or ~/.docker/config.json).
	RegistryConfig string
	// CAFile adds a PEM CA bundle to the system roots for the origin registry.
	CAFile string
	// CertFile and KeyFile are a client certificate for mutual TLS with the origin registry.
	CertFile, KeyFile string
	// Insecure skips TLS verification of the origin registry.
	Insecure bool
	// PlainHTTP talks HTTP instead of HTTPS to the origin registry.
	PlainHTTP bool
	// PlainHTTPHosts are the registries (host[:port]) talked to in HTTP when PlainHTTP is false: a node reaches
	// most registries over TLS and a few in-cluster ones without.
	PlainHTTPHosts []string
	// LoopbackPlainHTTP talks HTTP to a registry on a loopback host (localhost, 127.0.0.0/8, [::1]) unless TLS is
	// configured for it (CAFile, CertFile, Insecure), as Docker and containerd treat loopback registries: the CLI's
	// default. The driver leaves it off (a node's loopback is no developer's registry).
	LoopbackPlainHTTP bool
	// HostsDir is a containerd-style hosts directory configuring mirrors (see hosts.go).
	HostsDir string
	// Concurrency is how many blobs move at once; 0 means DefaultConcurrency().
	Concurrency int
	// Credential, if set, is asked first (e.g. credentials from a Kubernetes dockerconfigjson Secret); the docker
	// config is the fallback when it returns no credential.
	Credential auth.CredentialFunc
	// CredentialOnly makes Credential the only one presented: the docker config is not read, and where Credential
	// (or a nil one) has none for a host, requests go anonymous. A pod's request on a node is made so: the node's
	// credentials are the node's, not every pod's.
	CredentialOnly bool
	// UserAgent is sent with every request.
	UserAgent string
	// Timeouts bound the waits on a registry that stalls; zero fields take DefaultTimeouts.
	Timeouts Timeouts
	// Hints name, in errors, the settings that fix a TLS failure, in the words of the program using this package;
	// the zero value names the CLI's flags.
	Hints Hints
	// WrapTransport, if set, wraps the HTTP transport of each of a Repository's endpoints, under authentication
	// and retries: instrumentation (byte counts, tracing) sees every request as it goes on the wire.
	WrapTransport func(http.RoundTripper) http.RoundTripper
}

// Timeouts bound the waits on a registry. A registry that accepts a request and then says nothing would otherwise
// hold a pull forever.
type Timeouts struct {
	// ResponseHeader is how long a request waits for the response headers.
	ResponseHeader time.Duration
	// Idle is how long a blob read may go without a byte, its response headers included, before the attempt is
	// abandoned; the read then resumes on a new connection from the byte it stopped at.
	Idle time.Duration
	// Attempts is how many consecutive attempts of one blob read may fail without a byte of progress (refused,
	// stalled, cut off) before the read gives up with the last cause.
	Attempts int
}

// DefaultTimeouts: a registry answers within two minutes (committing a large upload takes a while), a blob
// download is never silent for 30 s (its response headers included), and eight attempts with backoff ride out a
// registry restart.
var DefaultTimeouts = Timeouts{ResponseHeader: 2 * time.Minute, Idle: 30 * time.Second, Attempts: 8}

// policy is the transfer policy of blob reads under t.
func (t Timeouts) policy() transfer.Policy {
	t = t.orDefault()
	p := transfer.Default
	p.Idle, p.Attempts = t.Idle, t.Attempts
	return p
}

func (t Timeouts) orDefault() Timeouts {
	if t.ResponseHeader <= 0 {
		t.ResponseHeader = DefaultTimeouts.ResponseHeader
	}
	if t.Idle <= 0 {
		t.Idle = DefaultTimeouts.Idle
	}
	if t.Attempts <= 0 {
		t.Attempts = DefaultTimeouts.Attempts
	}
	return t
}

// Hints tell a user which of the program's settings fixes a failure.
type Hints struct {
	// PlainHTTP is how to reach a registry that serves plain HTTP.
	PlainHTTP string
	// TLS is how to trust, or skip verifying, a registry's certificate.
	TLS string
	// Credentials, if set, is how to fix credentials the registry rejected; empty suggests `modelpack login`.
	// Credentials given explicitly (-u/-p) are fixed there, not by a login they override.
	Credentials string
	// Login, if set, is how to give credentials where `modelpack login` is no answer (a pod on a node); it replaces
	// that suggestion in refusals (401, 403).
	Login string
}

// CLIHints name the modelpack CLI's flags.
var CLIHints = Hints{
	PlainHTTP: "use --plain-http",
	TLS:       "pass --ca-file with the registry's CA, or --insecure to skip verification",
}

func (h Hints) orCLI() Hints {
	if h.PlainHTTP == "" {
		h.PlainHTTP = CLIHints.PlainHTTP
	}
	if h.TLS == "" {
		h.TLS = CLIHints.TLS
	}
	return h
}

// DefaultConcurrency is the number of blobs moved at once when Options.Concurrency is 0. Model layers are few and
// large and the work is mostly waiting on the network and disk, so it is more than the core count; hashing is the
// CPU part and scales with cores.
func DefaultConcurrency() int {
	n := 2 * runtime.NumCPU()
	return min(max(n, 4), 16)
}

func (o Options) concurrency() int {
	if o.Concurrency > 0 {
		return o.Concurrency
	}
	return DefaultConcurrency()
}

const defaultUserAgent = "modelpack"

// NewCredentialStore opens the docker config at path (docker's default when empty), including its credential
// helpers and credsStore. Credentials saved by Login are stored in plain text only when no helper is configured,
// as docker does.
func NewCredentialStore(path string) (credentials.Store, error) {
	opts := credentials.StoreOptions{AllowPlaintextPut: true, DetectDefaultNativeStore: true}
	if path == "" {
		return credentials.NewStoreFromDocker(opts)
	}
	return credentials.NewStore(path, opts)
}

// CredentialsFromDockerConfigJSON reads the content of a docker config.json (a kubernetes.io/dockerconfigjson
// Secret's .dockerconfigjson key) into a credential function.
func CredentialsFromDockerConfigJSON(b []byte) (auth.CredentialFunc, error) {
	store, err := credentials.NewMemoryStoreFromDockerConfig(b)
	if err != nil {
		return nil, fmt.Errorf("parse docker config: %w", err)
	}
	return credentials.Credential(store), nil
}

// credentialFunc is Options' credentials: the explicit credential, then the docker config.
func (o Options) credentialFunc() (auth.CredentialFunc, error) {
	if o.CredentialOnly {
		return orAnonymous(o.Credential), nil
	}
	store, err := NewCredentialStore(o.RegistryConfig)
	if err != nil {
		return nil, fmt.Errorf("registry config: %w", err)
	}
	return firstCredential(o.Credential, credentials.Credential(store)), nil
}

// anonymous has no credential for any host.
func anonymous(context.Context, string) (auth.Credential, error) { return auth.EmptyCredential, nil }

func orAnonymous(cf auth.CredentialFunc) auth.CredentialFunc {
	if cf == nil {
		return anonymous
	}
	return cf
}

// firstCredential asks first (when set) and, where it has no credential for the host, then.
func firstCredential(first, then auth.CredentialFunc) auth.CredentialFunc {
	if first == nil {
		return then
	}
	return func(ctx context.Context, host string) (auth.Credential, error) {
		c, err := first(ctx, host)
		if err != nil || c != auth.EmptyCredential {
			return c, err
		}
		return then(ctx, host)
	}
}

// tlsConfig builds the client TLS settings of an endpoint: system roots plus its CA files, its client certificates,
// and verification unless skipVerify.
func tlsConfig(ep endpoint) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: ep.skipVerify}
	if len(ep.caFiles) > 0 {
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		for _, f := range ep.caFiles {
			pem, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("CA file: %w", err)
			}
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("CA file %s: no PEM certificate in it", f)
			}
		}
		cfg.RootCAs = pool
	}
	for _, p := range ep.clientPairs {
		cert, err := tls.LoadX509KeyPair(p[0], p[1])
		if err != nil {
			return nil, fmt.Errorf("client certificate %s: %w", p[0], err)
		}
		cfg.Certificates = append(cfg.Certificates, cert)
	}
	return cfg, nil
}

// Buffer sizes of the HTTP transport: model layers are hundreds of MiB, and net/http's 4 KiB default costs a
// syscall per page.
const ioBufferSize = 256 << 10

// fileBufferSize is the chunk in which a fetch writes a file: larger writes cost the kernel less (1 MiB measured
// against 256 KiB: README, Performance).
const fileBufferSize = 1 << 20

// httpClient builds the HTTP client of one endpoint of registry origin. With retries, requests are retried by
// oras-go's retry transport under transfer.RequestRetry (5xx, 429, resets, with backoff): the origin's clients
// for everything but blob reads, which the transfer seam retries itself; a mirror's clients have none (its error
// moves the read to the next endpoint). Documents are limited above the retries (see limitDocuments).
func httpClient(o Options, ep endpoint, origin string, retries bool) (*http.Client, error) {
	t, err := httpTransport(o, ep, origin, retries)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: limitDocuments(t)}, nil
}

// httpTransport is httpClient's transport, before the document limit: the one place an endpoint's connections,
// TLS and rewrites are set up.
func httpTransport(o Options, ep endpoint, origin string, retries bool) (http.RoundTripper, error) {
	tc, err := tlsConfig(ep)
	if err != nil {
		return nil, err
	}
	base := &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: guardDial(&net.Dialer{
			Timeout:   30 * time.Second,
			KeepAlive: 30 * time.Second,
		}, ep),
		ForceAttemptHTTP2:     true,
		TLSClientConfig:       tc,
		TLSHandshakeTimeout:   15 * time.Second,
		ResponseHeaderTimeout: o.Timeouts.orDefault().ResponseHeader,
		ExpectContinueTimeout: time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   o.concurrency() + 4,
		// Blobs are already compressed or incompressible; asking for gzip would also defeat Range requests.
		DisableCompression: true,
		ReadBufferSize:     ioBufferSize,
		WriteBufferSize:    ioBufferSize,
	}
	var rt http.RoundTripper = base
	if o.WrapTransport != nil {
		rt = o.WrapTransport(rt)
	}
	ns := ""
	if ep.mirror {
		ns = origin
	}
	if ep.path != "" || ep.overridePath || ns != "" || len(ep.header) > 0 {
		rt = &rewriteTransport{base: rt, ep: ep, ns: ns}
	}
	if !retries {
		return rt, nil
	}
	return &retry.Transport{Base: rt, Policy: func() retry.Policy { return transfer.RequestRetry }}, nil
}

// authClient wraps an endpoint's HTTP client with oras-go's auth client (basic and bearer token flows).
func authClient(hc *http.Client, cred auth.CredentialFunc, cache auth.Cache, userAgent string) *auth.Client {
	c := &auth.Client{Client: hc, Credential: cred, Cache: cache}
	if userAgent == "" {
		userAgent = defaultUserAgent
	}
	c.SetUserAgent(userAgent)
	return c
}

var errNoEndpoint = errors.New("no endpoint with the needed capability")
