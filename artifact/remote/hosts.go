package remote

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/BurntSushi/toml"
)

// A hosts directory configures mirrors the way containerd's does (<dir>/<host[:port]>/hosts.toml, or
// <dir>/_default/hosts.toml), so the same files serve a pull-through cache, Harbor proxy project, Spegel or
// Dragonfly for both:
//
//	server = "https://registry.example.com"        # optional: where the origin really is
//
//	[host."http://127.0.0.1:65001"]                # tried first, in file order
//	  capabilities = ["pull", "resolve"]
//	  skip_verify = false
//	  ca = "/etc/certs/mirror-ca.pem"               # or a list; relative paths are relative to the file
//	  client = [["/etc/certs/c.pem", "/etc/certs/c.key"]]
//	  override_path = false                        # true: the URL path already includes the API root (/v2)
//	  [host."http://127.0.0.1:65001".header]
//	    X-Dragonfly-Registry = "https://registry.example.com"
//
// Reads try each mirror with the needed capability in order and then the origin; writes go to the origin only.

// endpoint is one place a repository can be reached.
type endpoint struct {
	scheme       string // http or https
	host         string // host[:port]
	path         string // path prefix before /v2 (or replacing /v2 with override_path)
	overridePath bool
	pull         bool
	resolve      bool
	push         bool
	mirror       bool
	caFiles      []string
	clientPairs  [][2]string
	skipVerify   bool
	header       http.Header
}

// serves reports whether ep may serve a read of a manifest or blob named by reference: a tag needs the resolve
// capability, a digest (content-addressed, checked on arrival) the pull capability, as containerd's hosts.toml
// has it. The origin serves every read.
func (ep endpoint) serves(reference string) bool {
	if !ep.mirror {
		return true
	}
	if isDigest(reference) {
		return ep.pull
	}
	return ep.resolve
}

// isDigest reports whether a reference (a tag, a digest, or a whole reference ending in either) names a digest.
func isDigest(reference string) bool {
	return strings.Contains(reference, "@") || (strings.Contains(reference, ":") && !strings.Contains(reference, "/"))
}

type hostsEntry struct {
	Capabilities []string       `toml:"capabilities"`
	CA           any            `toml:"ca"`
	Client       any            `toml:"client"`
	SkipVerify   *bool          `toml:"skip_verify"`
	Header       map[string]any `toml:"header"`
	OverridePath bool           `toml:"override_path"`
}

type hostsFile struct {
	Server       string                `toml:"server"`
	Capabilities []string              `toml:"capabilities"`
	CA           any                   `toml:"ca"`
	Client       any                   `toml:"client"`
	SkipVerify   *bool                 `toml:"skip_verify"`
	Header       map[string]any        `toml:"header"`
	OverridePath bool                  `toml:"override_path"`
	Host         map[string]hostsEntry `toml:"host"`
}

// loadEndpoints returns the endpoints for registry host in the order reads try them: mirrors first, the origin
// last. Without a hosts file for the host the origin alone is returned, configured from opts.
func loadEndpoints(opts Options, host string) ([]endpoint, error) {
	scheme := "https"
	if opts.PlainHTTP || slices.Contains(opts.PlainHTTPHosts, host) || opts.loopbackPlain(host) {
		scheme = "http"
	}
	origin := endpoint{
		scheme: scheme, host: host, pull: true, resolve: true, push: true,
		skipVerify: opts.Insecure,
	}
	if opts.CAFile != "" {
		origin.caFiles = []string{opts.CAFile}
	}
	if opts.CertFile != "" || opts.KeyFile != "" {
		if opts.CertFile == "" || opts.KeyFile == "" {
			return nil, errors.New("a client certificate needs both --cert-file and --key-file")
		}
		origin.clientPairs = [][2]string{{opts.CertFile, opts.KeyFile}}
	}
	if opts.HostsDir == "" {
		return []endpoint{origin}, nil
	}
	path, data, err := readHostsFile(opts.HostsDir, host)
	if err != nil || data == nil {
		return []endpoint{origin}, err
	}
	eps, err := endpointsFrom(origin, path, data)
	if err == nil {
		lastGoodHosts.Store(path, data)
		return eps, nil
	}
	err = fmt.Errorf("%w: %w", ErrHostsConfig, err)
	// A file that was good and turned bad (an edit under way, a mistake) keeps serving its last good content:
	// the registry stays reachable as it was, and the error is logged and counted at each use.
	if good, ok := lastGoodHosts.Load(path); ok {
		if eps, gerr := endpointsFrom(origin, path, good.([]byte)); gerr == nil {
			hostsReloadFailures.Add(1)
			slog.Warn("hosts.toml is invalid; keeping its last good content", "file", path, "error", err.Error())
			return eps, nil
		}
	}
	return nil, err
}

// ErrHostsConfig is a hosts.toml the driver or the CLI cannot use; the error names the file and the line.
var ErrHostsConfig = errors.New("invalid hosts.toml")

var (
	lastGoodHosts       sync.Map // path → the bytes of its last valid content
	hostsReloadFailures atomic.Int64
)

// HostsReloadFailures counts the uses of a hosts.toml that had turned invalid, served from its last good content.
func HostsReloadFailures() int64 { return hostsReloadFailures.Load() }

// ValidateHostsDir checks every hosts.toml under dir (DIR/HOST/hosts.toml, DIR/_default/hosts.toml) as a pull
// would read it, so that a driver starts only with files it can use; the error names the file and the line.
func ValidateHostsDir(dir string) error {
	if dir == "" {
		return nil
	}
	files, err := filepath.Glob(filepath.Join(dir, "*", "hosts.toml"))
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range files {
		host := filepath.Base(filepath.Dir(p))
		if _, err := loadEndpoints(Options{HostsDir: dir}, host); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// lineOf is the 1-based line of data where needle first appears, 0 if nowhere.
func lineOf(data []byte, needle string) int {
	i := bytes.Index(data, []byte(needle))
	if i < 0 {
		return 0
	}
	return bytes.Count(data[:i], []byte("\n")) + 1
}

// at names path and the line of needle in it.
func at(path string, data []byte, needle string) string {
	if n := lineOf(data, needle); n > 0 {
		return fmt.Sprintf("%s:%d", path, n)
	}
	return path
}

// endpointsFrom is loadEndpoints for the hosts file at path holding data.
func endpointsFrom(origin endpoint, path string, data []byte) ([]endpoint, error) {
	var f hostsFile
	md, err := toml.Decode(string(data), &f)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	base := filepath.Dir(path)
	if f.Server != "" {
		u, err := parseHostURL(f.Server)
		if err != nil {
			return nil, fmt.Errorf("%s: server %q: %w", at(path, data, "server"), f.Server, err)
		}
		origin.scheme, origin.host, origin.path = u.Scheme, u.Host, strings.TrimSuffix(u.Path, "/")
	}
	if err := applyEntry(&origin, hostsEntry{
		Capabilities: f.Capabilities, CA: f.CA, Client: f.Client, SkipVerify: f.SkipVerify, Header: f.Header,
		OverridePath: f.OverridePath,
	}, base); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	// Mirrors keep the order they have in the file, which a map loses: take it from the decoder's key list.
	var eps []endpoint
	seen := map[string]bool{}
	for _, key := range md.Keys() {
		if len(key) != 2 || key[0] != "host" || seen[key[1]] {
			continue
		}
		seen[key[1]] = true
		u, err := parseHostURL(key[1])
		if err != nil {
			return nil, fmt.Errorf("%s: host %q: %w", at(path, data, key[1]), key[1], err)
		}
		if u.Scheme == origin.scheme && u.Host == origin.host && strings.TrimSuffix(u.Path, "/") == origin.path {
			// The origin's own entry (containerd's way to give it a ca or client certificate): not a mirror.
			if err := applyEntry(&origin, f.Host[key[1]], base); err != nil {
				return nil, fmt.Errorf("%s: host %q: %w", at(path, data, key[1]), key[1], err)
			}
			continue
		}
		ep := endpoint{scheme: u.Scheme, host: u.Host, path: strings.TrimSuffix(u.Path, "/"), mirror: true,
			pull: true, resolve: true}
		if err := applyEntry(&ep, f.Host[key[1]], base); err != nil {
			return nil, fmt.Errorf("%s: host %q: %w", at(path, data, key[1]), key[1], err)
		}
		eps = append(eps, ep)
	}
	return append(eps, origin), nil
}

func readHostsFile(dir, host string) (string, []byte, error) {
	for _, name := range []string{host, "_default"} {
		p := filepath.Join(dir, name, "hosts.toml")
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return p, nil, err
		}
		return p, b, nil
	}
	return "", nil, nil
}

func parseHostURL(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("unsupported scheme %q", u.Scheme)
	}
	if u.Host == "" {
		return nil, errors.New("no host")
	}
	return u, nil
}

func applyEntry(ep *endpoint, e hostsEntry, base string) error {
	if e.Capabilities != nil {
		ep.pull, ep.resolve, ep.push = false, false, false
		for _, c := range e.Capabilities {
			switch c {
			case "pull":
				ep.pull = true
			case "resolve":
				ep.resolve = true
			case "push":
				ep.push = true
			default:
				return fmt.Errorf("unknown capability %q (valid: pull, resolve, push)", c)
			}
		}
	}
	if e.SkipVerify != nil {
		ep.skipVerify = *e.SkipVerify
	}
	ep.overridePath = e.OverridePath
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(base, p)
	}
	switch ca := e.CA.(type) {
	case nil:
	case string:
		ep.caFiles = []string{abs(ca)}
	case []any:
		ep.caFiles = nil
		for _, c := range ca {
			s, ok := c.(string)
			if !ok {
				return fmt.Errorf("ca: want a path or a list of paths, got %v", ca)
			}
			ep.caFiles = append(ep.caFiles, abs(s))
		}
	default:
		return fmt.Errorf("ca: want a path or a list of paths, got %v", ca)
	}
	if e.Client != nil {
		pairs, err := clientPairs(e.Client)
		if err != nil {
			return err
		}
		ep.clientPairs = nil
		for _, p := range pairs {
			ep.clientPairs = append(ep.clientPairs, [2]string{abs(p[0]), abs(p[1])})
		}
	}
	if len(e.Header) > 0 {
		ep.header = http.Header{}
		for k, v := range e.Header {
			switch v := v.(type) {
			case string:
				ep.header.Add(k, v)
			case []any:
				for _, x := range v {
					ep.header.Add(k, fmt.Sprint(x))
				}
			default:
				return fmt.Errorf("header %q: want a string or a list of strings", k)
			}
		}
	}
	return nil
}

// clientPairs accepts containerd's three spellings: "cert.pem" (key inside), ["cert.pem", "key.pem"] and
// [["cert.pem", "key.pem"], ...].
func clientPairs(v any) ([][2]string, error) {
	bad := fmt.Errorf("client: want \"cert\", [\"cert\", \"key\"] or [[\"cert\", \"key\"], ...], got %v", v)
	switch c := v.(type) {
	case string:
		return [][2]string{{c, c}}, nil
	case []any:
		if len(c) == 2 {
			a, ok1 := c[0].(string)
			b, ok2 := c[1].(string)
			if ok1 && ok2 {
				return [][2]string{{a, b}}, nil
			}
		}
		var out [][2]string
		for _, x := range c {
			pair, ok := x.([]any)
			if !ok || len(pair) == 0 || len(pair) > 2 {
				return nil, bad
			}
			a, ok := pair[0].(string)
			if !ok {
				return nil, bad
			}
			b := a
			if len(pair) == 2 {
				if b, ok = pair[1].(string); !ok {
					return nil, bad
				}
			}
			out = append(out, [2]string{a, b})
		}
		return out, nil
	}
	return nil, bad
}

// rewriteTransport sends a mirror's requests to its path prefix and tells it which registry is meant (the ns query
// parameter containerd adds, which Spegel and Harbor proxies read), and adds the configured headers.
type rewriteTransport struct {
	base http.RoundTripper
	ep   endpoint
	ns   string // origin registry host, for mirrors
}

func (t *rewriteTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.ep.path == "" && !t.ep.overridePath && t.ns == "" && len(t.ep.header) == 0 {
		return t.base.RoundTrip(req)
	}
	r := req.Clone(req.Context())
	// Only requests to the endpoint itself are rewritten; token requests to an auth realm pass through.
	if r.URL.Host == t.ep.host {
		if rest, ok := strings.CutPrefix(r.URL.Path, "/v2"); ok {
			if t.ep.overridePath {
				r.URL.Path = t.ep.path + rest
			} else {
				r.URL.Path = t.ep.path + "/v2" + rest
			}
			r.URL.RawPath = ""
		}
		if t.ns != "" {
			q := r.URL.Query()
			q.Set("ns", t.ns)
			r.URL.RawQuery = q.Encode()
		}
		for k, vs := range t.ep.header {
			for _, v := range vs {
				r.Header.Add(k, v)
			}
		}
	}
	return t.base.RoundTrip(r)
}

// loopbackPlain reports whether host is a loopback registry talked to in plain HTTP (Options.LoopbackPlainHTTP).
func (o Options) loopbackPlain(host string) bool {
	if !o.LoopbackPlainHTTP || o.CAFile != "" || o.CertFile != "" || o.Insecure {
		return false
	}
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
	if strings.EqualFold(name, "localhost") || strings.HasSuffix(strings.ToLower(name), ".localhost") {
		return true
	}
	ip := net.ParseIP(name)
	return ip != nil && ip.IsLoopback()
}
