package remote

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"

	"github.com/modelpack/modelpack/internal/errdef"
	"oras.land/oras-go/v2/content"
	oraserr "oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/errcode"
)

// Causes of a failed transfer. Every error returned by this package wraps at most one of them, so callers (the CSI
// driver maps them to gRPC codes) can test with errors.Is or switch on Classify.
var (
	ErrUnauthorized   = errdef.ErrUnauthorized
	ErrForbidden      = errdef.ErrForbidden
	ErrNotFound       = errdef.ErrNotFound
	ErrUnavailable    = errdef.ErrUnavailable
	ErrDigestMismatch = errdef.ErrDigestMismatch
	// ErrSizeMismatch: the registry's blob is not the size its descriptor declares; retrying cannot help.
	ErrSizeMismatch = errdef.ErrSizeMismatch
	ErrNoSpace      = errdef.ErrNoSpace
	ErrNotOCI       = errors.New("not an OCI registry")
	// ErrTLS is a certificate the client does not trust, or TLS spoken to a plain-HTTP server.
	ErrTLS = errors.New("TLS failure")
)

var sentinels = []error{ErrUnauthorized, ErrForbidden, ErrNotFound, ErrNoSpace, ErrSizeMismatch, ErrDigestMismatch, ErrNotOCI, ErrTLS, ErrRedirectRefused, ErrUnavailable}

// Classify returns the sentinel that describes err, or err itself when it is none of the known causes (and nil for
// nil). Context cancellation is returned as is.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return s
		}
	}
	if k := kindOf(err); k != nil {
		return k
	}
	return err
}

// kindOf inspects the errors of the layers below (net/http, oras-go, cas, the OS) for a known cause.
func kindOf(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return ErrNoSpace
	}
	if errors.Is(err, ErrSizeMismatch) || errors.Is(err, content.ErrTrailingData) {
		return ErrSizeMismatch
	}
	if errors.Is(err, ErrRedirectRefused) {
		return ErrRedirectRefused
	}
	if errors.Is(err, ErrDigestMismatch) || errors.Is(err, content.ErrMismatchedDigest) {
		return ErrDigestMismatch
	}
	var resp *errcode.ErrorResponse
	if errors.As(err, &resp) {
		if httpToHTTPS(resp) {
			return ErrTLS
		}
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			return ErrUnauthorized
		case http.StatusForbidden:
			return ErrForbidden
		case http.StatusNotFound:
			return ErrNotFound
		case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout,
			http.StatusRequestTimeout, http.StatusInternalServerError:
			return ErrUnavailable
		}
		for _, e := range resp.Errors {
			switch e.Code {
			case errcode.ErrorCodeDigestInvalid, errcode.ErrorCodeSizeInvalid:
				return ErrDigestMismatch
			case errcode.ErrorCodeDenied:
				return ErrForbidden
			case errcode.ErrorCodeUnauthorized:
				return ErrUnauthorized
			}
		}
		return nil
	}
	if errors.Is(err, oraserr.ErrNotFound) {
		return ErrNotFound
	}
	if errors.Is(err, auth.ErrBasicCredentialNotFound) {
		return ErrUnauthorized
	}
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalid x509.CertificateInvalidError
	var recordErr tls.RecordHeaderError
	if errors.As(err, &certErr) || errors.As(err, &unknownAuth) || errors.As(err, &hostErr) || errors.As(err, &invalid) ||
		errors.As(err, &recordErr) || strings.Contains(err.Error(), "server gave HTTP response to HTTPS client") {
		return ErrTLS
	}
	var dnsErr *net.DNSError
	var opErr *net.OpError
	if errors.As(err, &dnsErr) || errors.As(err, &opErr) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, errdef.ErrIncomplete) {
		// A transfer cut short (cas keeps the partial) is an interruption, not bad content.
		return ErrUnavailable
	}
	return nil
}

// Error is a failed registry operation: what was attempted, where, and why.
type Error struct {
	Op         string // pull, push, fetch, copy, resolve, login
	Registry   string // host[:port]
	Repository string
	Subject    string // the manifest reference or blob (digest and file name), if any
	Kind       error  // one of the sentinels, or nil
	Err        error  // the underlying error
	Hints      Hints  // the settings that fix a TLS failure; zero names the CLI's flags
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Op != "" {
		b.WriteString(e.Op)
		b.WriteString(" ")
	}
	if e.Kind == ErrNotFound && nameUnknown(e.Err) {
		// The registry's own text ends in a dump of its detail (map[name:…]); the repository is all there is to say.
		return b.String() + "repository " + e.Registry + "/" + e.Repository + " not found"
	}
	b.WriteString(e.Registry)
	if e.Repository != "" {
		b.WriteString("/")
		b.WriteString(e.Repository)
	}
	if e.Subject != "" {
		b.WriteString(" (")
		b.WriteString(e.Subject)
		b.WriteString(")")
	}
	b.WriteString(": ")
	b.WriteString(e.describe())
	return b.String()
}

// describe explains the cause in words a user can act on, keeping the underlying detail.
func (e *Error) describe() string {
	cause := e.Err.Error()
	var dnsErr *net.DNSError
	switch {
	case errors.As(e.Err, &dnsErr) && dnsErr.IsNotFound:
		return fmt.Sprintf("unknown host %q (no such host in DNS): check the registry's name", dnsErr.Name)
	case e.Kind == ErrUnauthorized && e.Hints.Credentials != "":
		var resp *errcode.ErrorResponse
		if errors.As(e.Err, &resp) {
			// The registry's detail is a dump of the scope asked for; the status says it all.
			cause = fmt.Sprintf("%s %q: %d %s", resp.Method, resp.URL, resp.StatusCode, http.StatusText(resp.StatusCode))
		}
		return fmt.Sprintf("credentials rejected (%s): %s", e.Hints.Credentials, cause)
	case e.Kind == ErrUnauthorized && e.Hints.Login != "":
		return fmt.Sprintf("authentication required or credentials rejected (%s): %s", e.Hints.Login, cause)
	case e.Kind == ErrUnauthorized:
		return fmt.Sprintf("authentication required or credentials rejected (run `modelpack login %s`): %s", e.Registry, cause)
	case e.Kind == ErrForbidden && e.Hints.Login != "":
		return fmt.Sprintf("access denied: the credentials lack permission for this repository (%s): %s", e.Hints.Login, cause)
	case e.Kind == ErrForbidden:
		return fmt.Sprintf("access denied: the credentials lack permission for this repository (check `modelpack login %s`): %s", e.Registry, cause)
	case e.Kind == ErrNotFound && strings.HasSuffix(cause, "not found"):
		return cause // oras says "…: not found" already
	case e.Kind == ErrNotFound:
		return "not found: " + cause
	case e.Kind == ErrDigestMismatch:
		if !strings.Contains(cause, "digest mismatch") {
			cause = "digest mismatch: " + cause
		}
		if !strings.Contains(cause, "dropped") {
			cause += " (the received bytes were dropped)"
		}
		return cause
	case e.Kind == ErrSizeMismatch:
		if !strings.Contains(cause, "size mismatch") {
			cause = "size mismatch: " + cause
		}
		return cause + " (the registry's blob is not the size the manifest declares; retrying cannot help)"
	case e.Kind == ErrNoSpace:
		return "disk full: " + cause
	case e.Kind == ErrNotOCI:
		return "the server does not speak the OCI distribution API: " + cause
	case e.Kind == ErrTLS && isHTTPToHTTPS(e.Err):
		return "the registry speaks HTTPS, not plain HTTP: drop --plain-http (or the host from --plain-http-registries; a loopback registry is talked to in plain HTTP unless --ca-file or --insecure is given); it answered 400 Bad Request"
	case e.Kind == ErrTLS && strings.Contains(cause, "HTTP response to HTTPS client"):
		return "the registry serves plain HTTP (" + e.Hints.orCLI().PlainHTTP + "): " + cause
	case e.Kind == ErrTLS:
		return "TLS verification failed (" + e.Hints.orCLI().TLS + "): " + cause
	case e.Kind == ErrUnavailable && (errors.Is(e.Err, syscall.ECONNREFUSED)):
		// One line, as oras says it: the request and dial details repeat the registry named before it.
		return fmt.Sprintf("connection refused: no registry listens at %s; start it or check the host and port", e.Registry)
	case e.Kind == ErrUnavailable:
		return "registry unavailable: " + cause
	}
	return cause
}

// httpToHTTPS recognises a TLS server's answer to a plain-HTTP request: Go's (the distribution registry's) says
// 400 Bad Request with no distribution error body.
func httpToHTTPS(resp *errcode.ErrorResponse) bool {
	return resp.StatusCode == http.StatusBadRequest && len(resp.Errors) == 0 && resp.URL != nil && resp.URL.Scheme == "http"
}

// nameUnknown reports whether the registry said the repository does not exist (NAME_UNKNOWN).
func nameUnknown(err error) bool {
	var resp *errcode.ErrorResponse
	if errors.As(err, &resp) {
		for _, e := range resp.Errors {
			if e.Code == errcode.ErrorCodeNameUnknown {
				return true
			}
		}
	}
	return false
}

func isHTTPToHTTPS(err error) bool {
	var resp *errcode.ErrorResponse
	return errors.As(err, &resp) && httpToHTTPS(resp)
}

// Unreachable reports whether err is a failure to reach the registry at all (connection refused, unknown host, no
// route): it concerns the registry, not one blob, and is worth saying once.
func Unreachable(err error) bool {
	var dnsErr *net.DNSError
	var opErr *net.OpError
	return errors.As(err, &dnsErr) || (errors.As(err, &opErr) && opErr.Op == "dial")
}

// Unwrap exposes both the sentinel and the underlying error to errors.Is/As.
func (e *Error) Unwrap() []error {
	if e.Kind == nil {
		return []error{e.Err}
	}
	return []error{e.Kind, e.Err}
}

// wrapErr names the registry, repository and subject of err, unless it already does.
func wrapErr(op, registry, repository, subject string, hints Hints, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	redactURLs(err)
	return &Error{Op: op, Registry: registry, Repository: repository, Subject: subject, Kind: kindOf(err), Err: err, Hints: hints}
}

// redactURLs drops user info and query strings from the URLs that net/http and oras-go print in err. A registry
// redirects blob reads to object storage with pre-signed URLs whose query carries credentials (a session token, a
// signature), and errors end up in logs and Kubernetes events. The errors are this request's own: edited in place,
// they keep their types for errors.Is and errors.As.
func redactURLs(err error) {
	var resp *errcode.ErrorResponse
	if errors.As(err, &resp) && resp.URL != nil && (resp.URL.RawQuery != "" || resp.URL.User != nil) {
		u := *resp.URL
		u.RawQuery, u.User = "", nil
		resp.URL = &u
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		if u, perr := url.Parse(ue.URL); perr == nil && (u.RawQuery != "" || u.User != nil) {
			u.RawQuery, u.User = "", nil
			ue.URL = u.String()
		}
	}
}

// retryable reports whether another attempt may succeed: network and server trouble yes; answers that will not
// change (auth, not found, bad digest, full disk, TLS) no.
func retryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	// Classify, not kindOf: a source's error that wraps a sentinel itself (the Hub's 401, its refused https→http
	// hop) is no more worth a retry than the registries' are.
	switch Classify(err) {
	case ErrUnauthorized, ErrForbidden, ErrNotFound, ErrSizeMismatch, ErrDigestMismatch, ErrNoSpace, ErrTLS, ErrNotOCI, ErrRedirectRefused:
		return false
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		return false
	}
	var resp *errcode.ErrorResponse
	if errors.As(err, &resp) && resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests &&
		resp.StatusCode != http.StatusRequestTimeout {
		return false
	}
	return true
}
