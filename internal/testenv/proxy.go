package testenv

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
)

// ProxyHooks are what a test does to the traffic of a Proxy; each may be nil.
type ProxyHooks struct {
	// Request sees every request before it is forwarded: it may count it or replace its Body (to count, gate or
	// cut an upload), or answer it itself and return false to stop it there.
	Request func(w http.ResponseWriter, r *http.Request) bool
	// Response sees every upstream response before it is sent: it may replace its Body (to count or pace a
	// download).
	Response func(resp *http.Response)
}

// Proxy is a reverse proxy in front of a registry, for tests that count, pace, gate or break what crosses the wire.
type Proxy struct {
	Host string // host:port
	srv  *httptest.Server
}

// Close stops the proxy (a mirror going down); it is also closed at test end.
func (p *Proxy) Close() { p.srv.Close() }

// StartProxy starts a plain-HTTP reverse proxy on loopback in front of upstream (host:port), closed at test end. Responses are flushed as they arrive, so a paced or stalled body reaches the client
// as it is sent; the proxy's own error log is dropped (tests that cut connections make it noisy).
func StartProxy(t testing.TB, upstream string, h ProxyHooks) *Proxy {
	t.Helper()
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: upstream})
	rp.ErrorLog = log.New(io.Discard, "", 0)
	rp.FlushInterval = -1
	if h.Response != nil {
		rp.ModifyResponse = func(resp *http.Response) error { h.Response(resp); return nil }
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.Request != nil && !h.Request(w, r) {
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return &Proxy{Host: strings.TrimPrefix(srv.URL, "http://"), srv: srv}
}
