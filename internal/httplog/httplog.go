// Package httplog is the CLI's --debug: an http.RoundTripper that prints every request and answer it carries —
// method, URL, status, headers and timings, never bodies — with the credentials in them redacted, as
// `oras --debug` and `crane -v` do.
package httplog

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Redacted replaces a credential's value.
const Redacted = "***"

// Logger writes the exchanges of every transport it wraps to one writer, a whole block at a time, so the lines of
// concurrent requests (blobs move in parallel) do not interleave; each exchange has a number to pair its lines.
type Logger struct {
	mu  sync.Mutex
	w   io.Writer
	seq atomic.Int64
	now func() time.Time
}

// New returns a Logger writing to w.
func New(w io.Writer) *Logger { return &Logger{w: w, now: time.Now} }

// Wrap returns next, logged.
func (l *Logger) Wrap(next http.RoundTripper) http.RoundTripper { return &transport{l: l, next: next} }

func (l *Logger) print(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = io.WriteString(l.w, s)
}

type transport struct {
	l    *Logger
	next http.RoundTripper
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	n := t.l.seq.Add(1)
	var b strings.Builder
	fmt.Fprintf(&b, "[debug #%d] > %s %s\n", n, req.Method, RedactURL(req.URL))
	writeHeaders(&b, n, ">", req.Header)
	t.l.print(b.String())
	start := t.l.now()
	resp, err := t.next.RoundTrip(req)
	headers := t.l.now().Sub(start)
	b.Reset()
	if err != nil {
		// The error may quote the URL (url.Error): print it with the URL redacted.
		fmt.Fprintf(&b, "[debug #%d] < error after %s: %s\n", n, round(headers), redactError(err, req.URL))
		t.l.print(b.String())
		return nil, err
	}
	fmt.Fprintf(&b, "[debug #%d] < %s %s (headers after %s)\n", n, resp.Proto, resp.Status, round(headers))
	writeHeaders(&b, n, "<", resp.Header)
	t.l.print(b.String())
	if resp.Body != nil && resp.Body != http.NoBody {
		resp.Body = &body{ReadCloser: resp.Body, l: t.l, n: n, start: start}
	} else {
		t.l.print(fmt.Sprintf("[debug #%d] < done in %s\n", n, round(headers)))
	}
	return resp, nil
}

// body reports, once, the total time and bytes of an answer when it is read to its end or closed.
type body struct {
	io.ReadCloser
	l     *Logger
	n     int64
	start time.Time
	bytes atomic.Int64 // a stall bound may Close while a Read waits
	once  sync.Once
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.bytes.Add(int64(n))
	if err != nil {
		b.done(err)
	}
	return n, err
}

func (b *body) Close() error {
	err := b.ReadCloser.Close()
	b.done(nil)
	return err
}

func (b *body) done(err error) {
	b.once.Do(func() {
		how := "done"
		if err != nil && err != io.EOF {
			how = "failed (" + err.Error() + ")"
		}
		b.l.print(fmt.Sprintf("[debug #%d] < %s in %s, %d body bytes read\n", b.n, how, round(b.l.now().Sub(b.start)), b.bytes.Load()))
	})
}

func round(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Microsecond)
}

// secretHeaders carry credentials: their values are never printed. WWW-Authenticate is not one: it names the
// realm and scope, what one needs to see when auth fails.
var secretHeaders = map[string]bool{
	"Authorization":        true,
	"Proxy-Authorization":  true,
	"Cookie":               true,
	"Set-Cookie":           true,
	"X-Amz-Security-Token": true,
	"X-Goog-Signature":     true,
}

func writeHeaders(b *strings.Builder, n int64, dir string, h http.Header) {
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		for _, v := range h[k] {
			fmt.Fprintf(b, "[debug #%d] %s %s: %s\n", n, dir, k, RedactHeader(k, v))
		}
	}
}

// RedactHeader is the value of header name as it may be printed: a credential header keeps only its scheme
// ("Bearer ***", "Basic ***"), a Location its URL redacted (RedactURL).
func RedactHeader(name, value string) string {
	name = http.CanonicalHeaderKey(name)
	switch {
	case secretHeaders[name]:
		if scheme, _, ok := strings.Cut(value, " "); ok && (name == "Authorization" || name == "Proxy-Authorization") {
			return scheme + " " + Redacted
		}
		return Redacted
	case name == "Location" || name == "Content-Location":
		if u, err := url.Parse(value); err == nil {
			return RedactURL(u)
		}
		return Redacted
	}
	return value
}

// RedactURL is u as it may be printed: no user info password, and the value of every query parameter that can
// hold a credential (tokens, pre-signed URLs' signatures and credentials) replaced.
func RedactURL(u *url.URL) string {
	if u == nil {
		return ""
	}
	c := *u
	_, hasPassword := c.User.Password()
	if hasPassword {
		c.User = url.UserPassword(c.User.Username(), "REDACTED")
	}
	if c.RawQuery != "" {
		q := c.Query()
		changed := false
		for k, vs := range q {
			if secretParam(k) {
				for i := range vs {
					vs[i] = Redacted
				}
				changed = true
			}
		}
		if changed {
			c.RawQuery = strings.ReplaceAll(q.Encode(), url.QueryEscape(Redacted), Redacted)
		}
	}
	s := c.String()
	if hasPassword {
		// url escapes "*" in user info; the placeholder is swapped after.
		s = strings.Replace(s, ":REDACTED@", ":"+Redacted+"@", 1)
	}
	return s
}

// secretParam reports whether a query parameter may carry a credential: tokens, passwords, keys, and the
// signatures and credentials of pre-signed URLs (S3's X-Amz-Signature and X-Amz-Credential, GCS's
// X-Goog-Signature, CloudFront's Signature, Key-Pair-Id and Policy, Azure's sig).
func secretParam(k string) bool {
	k = strings.ToLower(k)
	for _, s := range []string{"token", "signature", "credential", "password", "secret", "key", "auth"} {
		if strings.Contains(k, s) {
			return true
		}
	}
	return k == "sig" || k == "policy" || k == "code"
}

// redactError is err's text with u, as the url.Error of a failed request quotes it, redacted.
func redactError(err error, u *url.URL) string {
	s := err.Error()
	if u != nil {
		s = strings.ReplaceAll(s, u.String(), RedactURL(u))
	}
	return s
}
