package remote

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote/auth"
)

// Transports give, per registry host, the HTTP transport a client speaking the registry protocol itself (signing's
// cosign adapter, through go-containerregistry) uses to reach it as Repository does: the TLS settings of Options
// and hosts.toml (CA files, client certificates, skip_verify), the hosts.toml server and mirrors, and plain HTTP
// only where Options say. Every request to the registry goes out in its configured scheme, whatever the client
// asked: a client that falls back from https to http (go-containerregistry does for localhost, *.local and private
// addresses) cannot; an http:// request to any other host (an auth realm) is refused unless the registry itself is
// plain HTTP. Reads try the mirrors as Repository's do (see mirrorTransport). A request without an Authorization
// header is authenticated as Repository's are, with Credential, so a client need not ping the registry first:
// with the origin hung, reads that mirrors serve never wait on it.
type Transports struct {
	opts Options
	cred auth.CredentialFunc // Options'

	mu    sync.Mutex
	built map[string]http.RoundTripper
}

// NewTransports returns the transports of opts, whose docker config it opens.
func NewTransports(opts Options) (*Transports, error) {
	cred, err := opts.credentialFunc()
	if err != nil {
		return nil, err
	}
	return &Transports{opts: opts, cred: cred, built: map[string]http.RoundTripper{}}, nil
}

// Credential is the credential of host for a request made with ctx: the request's own (WithCredential), then
// Options' (Options.Credential, then the docker config). A client that authenticates by itself (a write's
// handshake) asks it, so it presents what the transport would.
func (t *Transports) Credential(ctx context.Context, host string) (auth.Credential, error) {
	return requestCredential(ctx, t.cred)(ctx, host)
}

// For returns the transport of registry host (host[:port]), built once.
func (t *Transports) For(host string) (http.RoundTripper, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rt, ok := t.built[host]; ok {
		return rt, nil
	}
	eps, err := loadEndpoints(t.opts, host)
	if err != nil {
		return nil, err
	}
	cache := auth.NewCache()
	origin := eps[len(eps)-1]
	hc, err := boundedClient(t.opts, origin, host)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", host, err)
	}
	// Redirects go back to the client, which checks where they lead, as they did before reads were
	// authenticated here.
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	var rt http.RoundTripper = &originTransport{base: hc.Transport, host: host, ep: origin,
		client: authClient(hc, t.cred, cache, t.opts.UserAgent), cred: t.cred}
	if len(eps) > 1 {
		if rt, err = newMirrorTransport(t.opts, host, eps[:len(eps)-1], rt, t.cred, cache); err != nil {
			return nil, err
		}
	}
	t.built[host] = rt
	return rt, nil
}

// originTransport sends a registry's requests to its configured endpoint, in its configured scheme. A request that
// carries no Authorization header, the API ping aside, is authenticated as Repository's are, by oras-go's auth
// client answering the registry's challenge: a client need not ping the registry first to learn how to
// authenticate (go-containerregistry does, before every operation, unless handed an authenticated transport).
type originTransport struct {
	base   http.RoundTripper
	host   string // the registry as clients name it
	ep     endpoint
	client *auth.Client
	cred   auth.CredentialFunc // Options'
}

func (t *originTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Host != t.host {
		if req.URL.Scheme == "http" && t.ep.scheme != "http" {
			return nil, fmt.Errorf("%w: refusing plain HTTP to %s for registry %s, which is reached over TLS", ErrTLS, req.URL.Host, t.host)
		}
		return t.base.RoundTrip(req)
	}
	r := retarget(req, t.ep)
	if r.Header.Get("Authorization") != "" || isPing(r) {
		return t.base.RoundTrip(r)
	}
	return requestClient(req, t.client, t.cred).Do(r)
}

// retarget is req for endpoint ep, in its scheme, with the pull scope of the repository it reads, which oras-go's
// auth client asks a token for.
func retarget(req *http.Request, ep endpoint) *http.Request {
	ctx := req.Context()
	if repo, _, _, ok := parseReadPath(req.URL.Path); ok {
		ctx = auth.AppendRepositoryScope(ctx, registry.Reference{Registry: ep.host, Repository: repo}, auth.ActionPull)
	}
	r := req.Clone(ctx)
	r.URL.Scheme, r.URL.Host, r.Host = ep.scheme, ep.host, ""
	return r
}

func isPing(req *http.Request) bool { return req.URL.Path == "/v2/" || req.URL.Path == "/v2" }

// mirrorTransport serves a registry's reads from its hosts.toml mirrors first, in file order, as Repository does:
// a manifest by tag from the mirrors that may resolve, a manifest by digest or a blob from those that may pull;
// the first 2xx answer wins, and any other answer or error (a miss, a mirror down) moves on to the next, then to
// the origin. Everything else (the API ping, writes, tag lists, referrers) goes to the origin, except that a ping
// the origin cannot answer (down, 5xx) is answered by a mirror, so a node cut off from the origin still reads.
//
// A mirror never sees the caller's Authorization header, which is meant for the origin: each mirror is
// authenticated on its own by oras-go's auth client, with the credentials a Repository would use for the mirror's
// host: the request's (WithCredential), then Options'.
type mirrorTransport struct {
	host    string // the registry as clients name it
	mirrors []*mirrorClient
	origin  http.RoundTripper
	cred    auth.CredentialFunc // Options'
}

type mirrorClient struct {
	ep     endpoint
	client *auth.Client // with Options' credentials and a token cache
}

type credentialKey struct{}

// requestCredentials are the credentials a call carries: cf first and, unless only, the fallback after it.
type requestCredentials struct {
	cf   auth.CredentialFunc
	only bool
}

// WithCredential returns a context carrying a request's own credentials (a volume's pull secret): requests
// through Transports ask cf first (see Transports.Credential), as a Repository whose Options.Credential is cf does.
// It is the one way a per-volume credential travels with a call.
func WithCredential(ctx context.Context, cf auth.CredentialFunc) context.Context {
	return context.WithValue(ctx, credentialKey{}, requestCredentials{cf: cf})
}

// WithOnlyCredential is WithCredential with nothing after cf (Options.CredentialOnly): where cf (or a nil cf) has
// no credential for a host, the request goes anonymous.
func WithOnlyCredential(ctx context.Context, cf auth.CredentialFunc) context.Context {
	return context.WithValue(ctx, credentialKey{}, requestCredentials{cf: cf, only: true})
}

// CredentialFrom returns the credential function WithCredential or WithOnlyCredential put in ctx, or nil.
func CredentialFrom(ctx context.Context) auth.CredentialFunc {
	rc, _ := ctx.Value(credentialKey{}).(requestCredentials)
	return rc.cf
}

// requestCredential is the credential function of a call made with ctx: its own, then (unless it carries only its
// own) fallback.
func requestCredential(ctx context.Context, fallback auth.CredentialFunc) auth.CredentialFunc {
	rc, ok := ctx.Value(credentialKey{}).(requestCredentials)
	switch {
	case !ok:
		return fallback
	case rc.only:
		return orAnonymous(rc.cf)
	}
	return firstCredential(rc.cf, fallback)
}

// requestClient is an endpoint's auth client c for req: c, or, when the request carries its own credentials (asked
// before cred, Options'), one without a token cache, so a token one volume's secret obtained never serves another
// volume.
func requestClient(req *http.Request, c *auth.Client, cred auth.CredentialFunc) *auth.Client {
	if _, ok := req.Context().Value(credentialKey{}).(requestCredentials); !ok {
		return c
	}
	return &auth.Client{Client: c.Client, Header: c.Header, Credential: requestCredential(req.Context(), cred)}
}

func newMirrorTransport(opts Options, host string, mirrors []endpoint, origin http.RoundTripper, cred auth.CredentialFunc, cache auth.Cache) (*mirrorTransport, error) {
	t := &mirrorTransport{host: host, origin: origin, cred: cred}
	for _, ep := range mirrors {
		hc, err := boundedClient(opts, ep, host)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ep.host, err)
		}
		t.mirrors = append(t.mirrors, &mirrorClient{ep: ep, client: authClient(hc, cred, cache, opts.UserAgent)})
	}
	return t, nil
}

func (t *mirrorTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Host != t.host || (req.Method != http.MethodGet && req.Method != http.MethodHead) {
		return t.origin.RoundTrip(req)
	}
	if isPing(req) {
		resp, err := t.origin.RoundTrip(req)
		if (err == nil && resp.StatusCode < http.StatusInternalServerError) || req.Context().Err() != nil {
			return resp, err
		}
		if m, merr := firstOf(req.Context(), t.mirrors, t.ask(req)); merr == nil {
			if resp != nil {
				discard(resp)
			}
			return m, nil
		}
		return resp, err
	}
	_, _, ref, ok := parseReadPath(req.URL.Path)
	if !ok {
		return t.origin.RoundTrip(req)
	}
	var hops []*mirrorClient
	for _, m := range t.mirrors {
		if m.ep.serves(ref) {
			hops = append(hops, m)
		}
	}
	// The origin comes last (nil), and its answer, whatever it is, is the answer, as in Repository's reads.
	ask := t.ask(req)
	return firstOf(req.Context(), append(hops, nil), func(m *mirrorClient) (*http.Response, error) {
		if m == nil {
			return t.origin.RoundTrip(req)
		}
		return ask(m)
	})
}

// ask returns the function sending req to a mirror, which serves it with a 2xx answer or not at all.
func (t *mirrorTransport) ask(req *http.Request) func(*mirrorClient) (*http.Response, error) {
	return func(m *mirrorClient) (*http.Response, error) {
		r := retarget(req, m.ep)
		r.Header.Del("Authorization") // the origin's
		resp, err := requestClient(req, m.client, t.cred).Do(r)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode/100 != 2 {
			discard(resp)
			return nil, fmt.Errorf("mirror %s: %s", m.ep.host, resp.Status)
		}
		return resp, nil
	}
}

// parseReadPath splits /v2/<repository>/{manifests,blobs}/<reference>.
func parseReadPath(p string) (repo, kind, ref string, ok bool) {
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		return "", "", "", false
	}
	for _, k := range []string{"/manifests/", "/blobs/"} {
		if i := strings.LastIndex(rest, k); i > 0 {
			ref = rest[i+len(k):]
			if ref != "" && !strings.Contains(ref, "/") {
				return rest[:i], strings.Trim(k, "/"), ref, true
			}
		}
	}
	return "", "", "", false
}

func discard(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

// boundedClient is the HTTP client of endpoint ep for Transports: httpClient, with each read bounded as the
// pull bounds its own (see stallBound).
func boundedClient(o Options, ep endpoint, host string) (*http.Client, error) {
	t, err := httpTransport(o, ep, host, !ep.mirror)
	if err != nil {
		return nil, err
	}
	// The document limit reads a document's body above the stall bound, which keeps watching it.
	return &http.Client{Transport: limitDocuments(stallBound{next: t, idle: o.Timeouts.orDefault().Idle, bounds: isRegistryRead})}, nil
}

func isRegistryRead(req *http.Request) bool {
	_, _, _, ok := parseReadPath(req.URL.Path)
	return ok && req.Method == http.MethodGet
}

// PlainURL is u for a message: without its user information, nor its query, where a pre-signed download URL
// carries its signature.
func PlainURL(u *url.URL) string {
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}).String()
}

// BoundStalls bounds every GET and HEAD through next as a registry's reads are bounded (Timeouts.Idle): the
// response must start within idle and its body may never pause for longer, else the request fails with
// ErrUnavailable. For the clients of other sources of models (the Hugging Face Hub), which would otherwise wait
// forever on a server that accepts a connection and says nothing.
func BoundStalls(next http.RoundTripper, idle time.Duration) http.RoundTripper {
	if idle <= 0 {
		idle = DefaultTimeouts.Idle
	}
	return stallBound{next: next, idle: idle, bounds: func(req *http.Request) bool {
		return req.Method == http.MethodGet || req.Method == http.MethodHead
	}}
}

// stallBound gives up a read (GET of a manifest or blob) that goes silent for idle, as the pull's reads do: its
// response must start within idle (the response-header timeout is for uploads), and no response body may pause
// for longer. The request fails with ErrUnavailable, so a mirror that hangs is passed
// for the next endpoint, and a stalled body ends the read instead of holding its caller to its own deadline.
type stallBound struct {
	next   http.RoundTripper
	idle   time.Duration
	bounds func(*http.Request) bool // the requests bounded
}

func (t stallBound) RoundTrip(req *http.Request) (*http.Response, error) {
	if !t.bounds(req) {
		return t.next.RoundTrip(req)
	}
	ctx, cancel := context.WithCancelCause(req.Context())
	var stalled error = &stallError{url: PlainURL(req.URL), idle: t.idle}
	watchdog := time.AfterFunc(t.idle, func() { cancel(stalled) })
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		watchdog.Stop()
		if context.Cause(ctx) == stalled {
			err = stalled
		}
		cancel(nil)
		return nil, err
	}
	watchdog.Reset(t.idle)
	resp.Body = &watchedBody{ReadCloser: resp.Body, ctx: ctx, cancel: cancel, watchdog: watchdog, idle: t.idle, stalled: stalled}
	return resp, nil
}

// stallError is a request whose server went silent: ErrUnavailable to errors.Is, in words that fit any server
// (a registry's errors say "registry unavailable" around it; the Hub client says its own).
type stallError struct {
	url  string
	idle time.Duration
}

func (e *stallError) Error() string        { return fmt.Sprintf("%s: no byte for %s", e.url, e.idle) }
func (e *stallError) Is(target error) bool { return target == ErrUnavailable }

type watchedBody struct {
	io.ReadCloser
	ctx      context.Context
	cancel   context.CancelCauseFunc
	watchdog *time.Timer
	idle     time.Duration
	stalled  error
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.watchdog.Reset(b.idle)
	}
	if err != nil && err != io.EOF && context.Cause(b.ctx) == b.stalled {
		err = b.stalled
	}
	return n, err
}

func (b *watchedBody) Close() error {
	b.watchdog.Stop()
	b.cancel(nil)
	return b.ReadCloser.Close()
}
