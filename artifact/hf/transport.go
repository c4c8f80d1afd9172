package hf

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/modelpack/modelpack/artifact/remote"
)

// httpClient is the client of the Hub at endpoint. Where it connects and what it sends are the registries' rules:
//   - it dials through remote.GuardDial, so a redirect or a next page can reach loopback, link-local or
//     unspecified addresses (the node's kubelet, 169.254.169.254) only if that is the endpoint's own host:port;
//   - the token goes only to the endpoint's origin (scheme, host and port): added per request by the transport, it
//     never rides a redirect or a next page to the download hosts LFS files redirect to, or anywhere else,
//     whatever the status (307/308 too) and however often a 429 there is retried;
//   - a redirect from https to plain http (the same host included) is refused, as the registries' are.
//
// wrap, if not nil, wraps the connections' transport, under the token and the redirects: it sees each hop as it
// goes on the wire (the CLI's --debug).
func httpClient(endpoint *url.URL, token string, idle time.Duration, wrap func(http.RoundTripper) http.RoundTripper) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = remote.GuardDial(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}, endpoint.Scheme, endpoint.Host, "Hub")
	tr.MaxIdleConnsPerHost = 16
	var next http.RoundTripper = tr
	if wrap != nil {
		next = wrap(tr)
	}
	rt := bearer{next: next, origin: origin(endpoint), token: token}
	return &http.Client{Transport: remote.BoundStalls(rt, idle), CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return fmt.Errorf("stopped after 10 redirects")
		}
		return checkHop(via[len(via)-1].URL, req.URL)
	}}
}

// checkHop refuses a move (a redirect, a next page) from https to anything else, as remote.ErrTLS (not worth a
// retry): the bytes are checked, but a pre-signed URL or a listing is not for the network to read, and anyone in
// the way could answer instead.
func checkHop(from, to *url.URL) error {
	if from.Scheme == "https" && to.Scheme != "https" {
		return fmt.Errorf("%w: refusing to follow %s to %s: plain HTTP after HTTPS", remote.ErrTLS, remote.PlainURL(from), remote.PlainURL(to))
	}
	return nil
}

// bearer authenticates the requests to the Hub's own origin with the token, and only those.
type bearer struct {
	next   http.RoundTripper
	origin string
	token  string
}

func (b bearer) RoundTrip(req *http.Request) (*http.Response, error) {
	mine := b.token != "" && origin(req.URL) == b.origin
	if !mine && req.Header.Get("Authorization") == "" {
		return b.next.RoundTrip(req)
	}
	r := req.Clone(req.Context())
	r.Header.Del("Authorization")
	if mine {
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	return b.next.RoundTrip(r)
}

// origin is u's scheme, host and port (the scheme's default made explicit), lower case: two URLs of one origin
// reach the same server in the same way. https://hub and http://hub are two origins, as are hub:443 and hub:8443.
func origin(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return strings.ToLower(u.Scheme) + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}
