package remote

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote/auth"
)

// TransportsFor returns, per registry host, the HTTP transport a client speaking the registry protocol itself
// (cosign's signature reads) must use to reach it as this package does: the TLS settings of opts and hosts.toml
// (CA files, client certificates, skip_verify), the hosts.toml server and mirrors, and plain HTTP only for
// opts.PlainHTTP, the hosts listed in plainHTTP, or a hosts.toml server in http://. Every request to the registry
// goes out in its configured scheme, whatever the client asked: a client that falls back from https to http
// (go-containerregistry does for localhost, *.local and private addresses) cannot; an http:// request to any other
// host (an auth realm) is refused unless the registry itself is plain HTTP. Reads try the mirrors as
// Repository's do (see mirrorTransport). A request without an Authorization header is authenticated as
// Repository's are (Options' credentials, after WithCredential's), so a client need not ping the registry first:
// with the origin hung, reads that mirrors serve never wait on it. Transports are built once per host.
func TransportsFor(opts Options, plainHTTP []string) func(host string) (http.RoundTripper, error) {
	var mu sync.Mutex
	built := map[string]http.RoundTripper{}
	return func(host string) (http.RoundTripper, error) {
		mu.Lock()
		defer mu.Unlock()
		if t, ok := built[host]; ok {
			return t, nil
		}
		o := opts
		if slices.Contains(plainHTTP, host) {
			o.PlainHTTP = true
		}
		eps, err := loadEndpoints(o, host)
		if err != nil {
			return nil, err
		}
		cred, err := o.credentialFunc()
		if err != nil {
			return nil, err
		}
		cache := auth.NewCache()
		origin := eps[len(eps)-1]
		hc, err := boundedClient(o, origin, host)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", host, err)
		}
		// Redirects go back to the client, which checks where they lead, as they did before reads were
		// authenticated here.
		hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		var t http.RoundTripper = &originTransport{base: hc.Transport, host: host, ep: origin,
			client: authClient(hc, cred, cache, o.UserAgent), cred: cred}
		if len(eps) > 1 {
			if t, err = newMirrorTransport(o, host, eps[:len(eps)-1], t, cred, cache); err != nil {
				return nil, err
			}
		}
		built[host] = t
		return t, nil
	}
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
	ctx := req.Context()
	if repo, _, _, ok := parseReadPath(req.URL.Path); ok {
		ctx = auth.AppendRepositoryScope(ctx, registry.Reference{Registry: t.ep.host, Repository: repo}, auth.ActionPull)
	}
	r := req.Clone(ctx)
	r.URL.Scheme, r.URL.Host, r.Host = t.ep.scheme, t.ep.host, ""
	if r.Header.Get("Authorization") != "" || isPing(r) {
		return t.base.RoundTrip(r)
	}
	return requestClient(req, t.client, t.cred).Do(r)
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
	mirrors []mirrorClient
	origin  http.RoundTripper
	cred    auth.CredentialFunc // Options'
}

type mirrorClient struct {
	ep     endpoint
	client *auth.Client // with Options' credentials and a token cache
}

type credentialKey struct{}

// WithCredential returns a context carrying a request's own credentials (a volume's pull secret): requests
// through TransportsFor's transports ask cf first, as a Repository whose Options.Credential is cf does, and so
// does signing's registry client. It is the one way a per-volume credential travels.
func WithCredential(ctx context.Context, cf auth.CredentialFunc) context.Context {
	return context.WithValue(ctx, credentialKey{}, cf)
}

// CredentialFrom returns the credentials WithCredential put in ctx, or nil.
func CredentialFrom(ctx context.Context) auth.CredentialFunc {
	cf, _ := ctx.Value(credentialKey{}).(auth.CredentialFunc)
	return cf
}

// requestClient is an endpoint's auth client c for req: c, or, when the request carries its own credentials (asked
// before cred, Options'), one without a token cache, so a token one volume's secret obtained never serves another
// volume.
func requestClient(req *http.Request, c *auth.Client, cred auth.CredentialFunc) *auth.Client {
	cf := CredentialFrom(req.Context())
	if cf == nil {
		return c
	}
	return &auth.Client{Client: c.Client, Header: c.Header, Credential: func(ctx context.Context, host string) (auth.Credential, error) {
		c, err := cf(ctx, host)
		if err != nil || c != auth.EmptyCredential {
			return c, err
		}
		return cred(ctx, host)
	}}
}

func newMirrorTransport(opts Options, host string, mirrors []endpoint, origin http.RoundTripper, cred auth.CredentialFunc, cache auth.Cache) (*mirrorTransport, error) {
	t := &mirrorTransport{host: host, origin: origin, cred: cred}
	for _, ep := range mirrors {
		hc, err := boundedClient(opts, ep, host)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ep.host, err)
		}
		t.mirrors = append(t.mirrors, mirrorClient{ep: ep, client: authClient(hc, cred, cache, opts.UserAgent)})
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
		if m, ok := t.firstMirror(req, func(endpoint) bool { return true }, ""); ok {
			if resp != nil {
				discard(resp)
			}
			return m, nil
		}
		return resp, err
	}
	repo, kind, ref, ok := parseReadPath(req.URL.Path)
	if !ok {
		return t.origin.RoundTrip(req)
	}
	byTag := kind == "manifests" && !strings.Contains(ref, ":")
	can := func(ep endpoint) bool { return (byTag && ep.resolve) || (!byTag && ep.pull) }
	if resp, ok := t.firstMirror(req, can, repo); ok {
		return resp, nil
	}
	if req.Context().Err() != nil {
		return nil, req.Context().Err()
	}
	return t.origin.RoundTrip(req)
}

// firstMirror returns the first 2xx answer of a mirror that can serve req.
func (t *mirrorTransport) firstMirror(req *http.Request, can func(endpoint) bool, repo string) (*http.Response, bool) {
	for _, m := range t.mirrors {
		if !can(m.ep) {
			continue
		}
		ctx := req.Context()
		if repo != "" {
			ctx = auth.AppendRepositoryScope(ctx, registry.Reference{Registry: m.ep.host, Repository: repo}, auth.ActionPull)
		}
		r := req.Clone(ctx)
		r.URL.Scheme, r.URL.Host, r.Host = m.ep.scheme, m.ep.host, ""
		r.Header.Del("Authorization") // the origin's
		resp, err := requestClient(req, m.client, t.cred).Do(r)
		if err == nil && resp.StatusCode/100 == 2 {
			return resp, true
		}
		if err == nil {
			discard(resp)
		}
		if req.Context().Err() != nil {
			return nil, false
		}
	}
	return nil, false
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

// boundedClient is the HTTP client of endpoint ep for TransportsFor: httpClient, with each read bounded as the
// pull bounds its own (see stallBound).
func boundedClient(o Options, ep endpoint, host string) (*http.Client, error) {
	tm := o.Timeouts.orDefault()
	t, err := httpTransport(ep, host, o.concurrency(), tm, o.WrapTransport)
	if err != nil {
		return nil, err
	}
	// The document limit reads a document's body above the stall bound, which keeps watching it.
	return &http.Client{Transport: LimitDocuments(stallBound{next: t, idle: tm.Idle})}, nil
}

// stallBound gives up a read (GET of a manifest or blob) that goes silent for idle, as the pull's reads do: its
// response must start within idle (the response-header timeout is for uploads), and no response body may pause
// for longer. The request fails with ErrUnavailable, so a mirror that hangs is passed
// for the next endpoint, and a stalled body ends the read instead of holding its caller to its own deadline.
type stallBound struct {
	next http.RoundTripper
	idle time.Duration
}

func (t stallBound) RoundTrip(req *http.Request) (*http.Response, error) {
	if _, _, _, ok := parseReadPath(req.URL.Path); !ok || req.Method != http.MethodGet {
		return t.next.RoundTrip(req)
	}
	ctx, cancel := context.WithCancelCause(req.Context())
	stalled := fmt.Errorf("%w: %s: no byte for %s", ErrUnavailable, req.URL.Redacted(), t.idle)
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
