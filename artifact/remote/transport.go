package remote

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
)

// TransportsFor returns, per registry host, the HTTP transport a client speaking the registry protocol itself
// (cosign's signature reads) must use to reach it as this package does: the TLS settings of opts and hosts.toml
// (CA files, client certificates, skip_verify), the hosts.toml server, and plain HTTP only for opts.PlainHTTP, the
// hosts listed in plainHTTP, or a hosts.toml server in http://. Every request to the registry goes out in its
// configured scheme, whatever the client asked: a client that falls back from https to http (go-containerregistry
// does for localhost, *.local and private addresses) cannot; an http:// request to any other host (an auth realm)
// is refused unless the registry itself is plain HTTP. Transports are built once per host.
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
		origin := eps[len(eps)-1]
		hc, err := httpClient(origin, host, o.concurrency(), o.Timeouts.orDefault())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", host, err)
		}
		t := &originTransport{base: hc.Transport, host: host, ep: origin}
		built[host] = t
		return t, nil
	}
}

// originTransport sends a registry's requests to its configured endpoint, in its configured scheme.
type originTransport struct {
	base http.RoundTripper
	host string // the registry as clients name it
	ep   endpoint
}

func (t *originTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Host != t.host {
		if req.URL.Scheme == "http" && t.ep.scheme != "http" {
			return nil, fmt.Errorf("%w: refusing plain HTTP to %s for registry %s, which is reached over TLS", ErrTLS, req.URL.Host, t.host)
		}
		return t.base.RoundTrip(req)
	}
	r := req.Clone(req.Context())
	r.URL.Scheme, r.URL.Host, r.Host = t.ep.scheme, t.ep.host, ""
	return t.base.RoundTrip(r)
}
