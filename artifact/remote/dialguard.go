package remote

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"syscall"

	"golang.org/x/net/http/httpproxy"
)

// ErrRedirectRefused is a connection to a loopback or link-local address (the node's kubelet on 127.0.0.1:10250,
// the cloud metadata service on 169.254.169.254) that the registry being read did not name itself: a redirect of
// a blob read there would let a registry make the node send requests it never meant to.
var ErrRedirectRefused = errors.New("connection to a loopback or link-local address refused")

// guardDial is the dialer of an endpoint's transport: connections to the endpoint itself (ep's host and port, as
// configured) and to the environment's proxies go through unchecked; any other (a redirect's) is refused when
// the address it reaches, after name resolution, is loopback, link-local or unspecified. The check is on the
// address dialled, so a DNS name that resolves there is refused as well.
func guardDial(d *net.Dialer, ep endpoint) func(ctx context.Context, network, addr string) (net.Conn, error) {
	allow := map[string]bool{withPort(ep.host, ep.scheme): true}
	cfg := httpproxy.FromEnvironment()
	for _, p := range []string{cfg.HTTPProxy, cfg.HTTPSProxy} {
		if u, err := url.Parse(p); err == nil && u.Host != "" {
			allow[withPort(u.Host, u.Scheme)] = true
		}
	}
	guarded := *d
	guarded.Control = func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return nil
		}
		if ip := ap.Addr().Unmap(); ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() {
			return fmt.Errorf("%w: %s", ErrRedirectRefused, address)
		}
		return nil
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if allow[addr] {
			return d.DialContext(ctx, network, addr)
		}
		c, err := guarded.DialContext(ctx, network, addr)
		if errors.Is(err, ErrRedirectRefused) {
			return nil, fmt.Errorf("%w: %s, reached by the registry %s, is not that registry", ErrRedirectRefused, addr, ep.host)
		}
		return c, err
	}
}

// withPort is host[:port] with the scheme's default port made explicit, as a dialled address has it.
func withPort(host, scheme string) string {
	if _, _, err := net.SplitHostPort(host); err == nil {
		return host
	}
	if scheme == "http" {
		return net.JoinHostPort(host, "80")
	}
	return net.JoinHostPort(host, "443")
}
