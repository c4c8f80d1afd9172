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

// guardDial is the dialer of a registry endpoint's transport (see GuardDial).
func guardDial(d *net.Dialer, ep endpoint) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return GuardDial(d, ep.scheme, ep.host, "registry")
}

// GuardDial is the dialer of a client of one source of models reached at scheme://host (a registry endpoint, the
// Hugging Face Hub; kind names it in errors): connections to the source itself (its host and port as configured,
// or another name for the same address and port: the same socket) and to the environment's proxies go through
// unchecked; any other (a redirect's, a next page's) is refused when the address it reaches, after name
// resolution, is loopback, link-local or unspecified. The check is on the address dialled, so a DNS name that
// resolves there is refused as well.
func GuardDial(d *net.Dialer, scheme, host, kind string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	self := withPort(host, scheme)
	allow := map[string]bool{self: true}
	cfg := httpproxy.FromEnvironment()
	for _, p := range []string{cfg.HTTPProxy, cfg.HTTPSProxy} {
		if u, err := url.Parse(p); err == nil && u.Host != "" {
			allow[withPort(u.Host, u.Scheme)] = true
		}
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if allow[addr] {
			return d.DialContext(ctx, network, addr)
		}
		own := ownAddrs(ctx, self)
		guarded := *d
		guarded.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return nil
			}
			ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
			if ip := ap.Addr(); !own[ap] && (ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified()) {
				return fmt.Errorf("%w: %s", ErrRedirectRefused, address)
			}
			return nil
		}
		c, err := guarded.DialContext(ctx, network, addr)
		if errors.Is(err, ErrRedirectRefused) {
			return nil, fmt.Errorf("%w: %s, reached by the %s %s, is not that %s", ErrRedirectRefused, addr, kind, host, kind)
		}
		return c, err
	}
}

// ownAddrs are the addresses the source's host:port resolves to now: a connection there reaches the source itself,
// under whatever name. A name that no longer resolves has none.
func ownAddrs(ctx context.Context, hostport string) map[netip.AddrPort]bool {
	h, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil
	}
	port, err := net.LookupPort("tcp", p)
	if err != nil {
		return nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", h)
	if err != nil {
		return nil
	}
	own := map[netip.AddrPort]bool{}
	for _, ip := range ips {
		own[netip.AddrPortFrom(ip.Unmap(), uint16(port))] = true
	}
	return own
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
