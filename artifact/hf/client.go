package hf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/internal/errdef"
)

// DefaultEndpoint is the public Hub; HF_ENDPOINT overrides it, as for huggingface_hub.
const DefaultEndpoint = "https://huggingface.co"

// Client talks to one Hub endpoint. The zero value is not usable: use NewClient or FromEnv.
type Client struct {
	endpoint *url.URL
	token    string
	http     *http.Client
	idle     time.Duration
	// MaxRetryAfter caps the wait a 429 answer asks for; RateLimitAttempts bounds how many are waited out.
	MaxRetryAfter     time.Duration
	RateLimitAttempts int
}

// NewClient returns a client of the Hub at endpoint, authenticating with token if it is not empty. The token is
// sent to the endpoint's origin only (scheme, host, port): the download hosts LFS files redirect to get pre-signed
// URLs, not the token, and no redirect or next page reaches the node itself (see httpClient).
// No request may wait longer than idle (0: the registries' default, remote.DefaultTimeouts) for its answer or
// for the next byte of it: a download then resumes on a new connection, any other request fails.
func NewClient(endpoint, token string, idle time.Duration) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(endpoint, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("Hub endpoint %q (HF_ENDPOINT): want an http or https URL such as %s", endpoint, DefaultEndpoint)
	}
	if idle <= 0 {
		idle = remote.DefaultTimeouts.Idle
	}
	return &Client{endpoint: u, token: token, idle: idle, MaxRetryAfter: 5 * time.Minute, RateLimitAttempts: 5,
		http: httpClient(u, token, idle, nil)}, nil
}

// WrapTransport makes wrap wrap the transport of c's connections, under authentication and redirects, as
// remote.Options.WrapTransport does a registry's: instrumentation sees every request as it goes on the wire.
func (c *Client) WrapTransport(wrap func(http.RoundTripper) http.RoundTripper) {
	c.http = httpClient(c.endpoint, c.token, c.idle, wrap)
}

// FromEnv returns a client configured as huggingface_hub configures itself: HF_ENDPOINT (default the public
// Hub), the token from HF_TOKEN, else the file HF_TOKEN_PATH, else $HF_HOME/token (HF_HOME defaulting to
// $XDG_CACHE_HOME/huggingface, then ~/.cache/huggingface), and HF_HUB_DOWNLOAD_TIMEOUT, the seconds a request
// may wait for a byte (default here: the registries' 30 s).
func FromEnv() (*Client, error) {
	endpoint := os.Getenv("HF_ENDPOINT")
	if endpoint == "" {
		endpoint = DefaultEndpoint
	}
	var idle time.Duration
	if v := strings.TrimSpace(os.Getenv("HF_HUB_DOWNLOAD_TIMEOUT")); v != "" {
		secs, err := strconv.ParseFloat(v, 64)
		if err != nil || secs <= 0 || secs > 24*3600 {
			return nil, fmt.Errorf("HF_HUB_DOWNLOAD_TIMEOUT=%q: want the seconds a request may wait for a byte, above 0 (e.g. 30)", v)
		}
		idle = time.Duration(secs * float64(time.Second))
	}
	return NewClient(endpoint, tokenFromEnv(), idle)
}

func tokenFromEnv() string {
	if t := strings.TrimSpace(os.Getenv("HF_TOKEN")); t != "" {
		return t
	}
	file := os.Getenv("HF_TOKEN_PATH")
	if file == "" {
		home := os.Getenv("HF_HOME")
		if home == "" {
			cache := os.Getenv("XDG_CACHE_HOME")
			if cache == "" {
				if h, err := os.UserHomeDir(); err == nil {
					cache = filepath.Join(h, ".cache")
				}
			}
			home = filepath.Join(cache, "huggingface")
		}
		file = filepath.Join(home, "token")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Endpoint is the Hub's base URL, without a trailing slash.
func (c *Client) Endpoint() string { return c.endpoint.String() }

// HasToken reports whether requests carry a token.
func (c *Client) HasToken() bool { return c.token != "" }

// do sends a request to the Hub, waiting out 429 answers as long as their Retry-After says (capped by
// MaxRetryAfter, at most RateLimitAttempts times), and turns error answers into errors that say what to do.
// what names the object asked for in messages. body, if set, is called for each attempt.
func (c *Client) do(ctx context.Context, method, rawURL, what string, header http.Header, body func() io.Reader) (*http.Response, error) {
	for attempt := 1; ; attempt++ {
		var b io.Reader
		if body != nil {
			b = body()
		}
		req, err := http.NewRequestWithContext(ctx, method, rawURL, b)
		if err != nil {
			return nil, err
		}
		for k, v := range header {
			req.Header[k] = v
		}
		req.Header.Set("User-Agent", "modelpack") // the token is the transport's to add (see httpClient)
		resp, err := c.http.Do(req)
		if err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				if u, perr := url.Parse(ue.URL); perr == nil {
					ue.URL = remote.PlainURL(u)
				}
			}
			return nil, fmt.Errorf("%w: %s: %w", errUnavailable, what, redact(err, c.token))
		}
		if resp.StatusCode != http.StatusTooManyRequests {
			if resp.StatusCode >= 400 {
				defer resp.Body.Close()
				return nil, c.statusError(resp, what)
			}
			return resp, nil
		}
		wait := retryAfter(resp.Header.Get("Retry-After"))
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if attempt >= c.RateLimitAttempts {
			return nil, fmt.Errorf("%w: %s: the Hub is rate limiting (429) after %d attempts; try again later, or set HF_TOKEN (authenticated requests get a higher limit)", errUnavailable, what, attempt)
		}
		if wait > c.MaxRetryAfter {
			return nil, fmt.Errorf("%w: %s: the Hub is rate limiting (429) and asks to wait %s; try again later", errUnavailable, what, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// retryAfter parses Retry-After (seconds, or an HTTP date); absent or unreadable, one second.
func retryAfter(v string) time.Duration {
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return time.Second
}

// statusError is the error of an answer >= 400. Authentication failures name the token to set; the Hub's own
// message (X-Error-Message, or the JSON "error") is kept.
func (c *Client) statusError(resp *http.Response, what string) error {
	msg := resp.Header.Get("X-Error-Message")
	if msg == "" {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		if s := jsonError(b); s != "" {
			msg = s
		}
	}
	if msg != "" {
		msg = " (" + redact(errors.New(msg), c.token).Error() + ")"
	}
	if resp.Request != nil && origin(resp.Request.URL) != origin(c.endpoint) {
		// A redirect or next page led away from the Hub: the answer is that host's, which got no token.
		msg += fmt.Sprintf(" from %s, where the Hub sent it and the token is not sent", remote.PlainURL(resp.Request.URL))
	}
	code := resp.Header.Get("X-Error-Code")
	switch {
	case code == "RepoNotFound" && c.token == "":
		return fmt.Errorf("%w: %s: no such repository, or a private one: set HF_TOKEN to a Hugging Face access token that can read it%s", errdef.ErrNotFound, what, msg)
	case code == "RepoNotFound":
		return fmt.Errorf("%w: %s: no such repository, or a private one the token in HF_TOKEN (or $HF_HOME/token) cannot read%s", errdef.ErrNotFound, what, msg)
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden || code == "GatedRepo":
		kind, hint := errdef.ErrUnauthorized, "the repository is private or gated: set HF_TOKEN to a Hugging Face access token that can read it (or log in with `hf auth login`, which writes $HF_HOME/token)"
		if resp.StatusCode == http.StatusForbidden {
			kind = errdef.ErrForbidden
		}
		if c.token != "" {
			hint = "the token in HF_TOKEN (or $HF_HOME/token) cannot read it: accept the model's conditions on its page, or use a token with access"
		}
		return fmt.Errorf("%w: %s: %d %s%s; %s", kind, what, resp.StatusCode, http.StatusText(resp.StatusCode), msg, hint)
	case resp.StatusCode == http.StatusNotFound:
		hint := "no such repository, revision or file"
		switch code {
		case "RepoNotFound":
			hint = "no such repository (a private one needs HF_TOKEN)"
		case "RevisionNotFound":
			hint = "no such revision (branch, tag or commit)"
		case "EntryNotFound":
			hint = "no such file at that revision"
		}
		return fmt.Errorf("%w: %s: %s%s", errdef.ErrNotFound, what, hint, msg)
	case resp.StatusCode >= 500:
		return fmt.Errorf("%w: %s: %d %s%s", errUnavailable, what, resp.StatusCode, http.StatusText(resp.StatusCode), msg)
	}
	return fmt.Errorf("%s: %d %s%s", what, resp.StatusCode, http.StatusText(resp.StatusCode), msg)
}

// redact keeps the token out of an error that might quote a request.
func redact(err error, token string) error {
	if token == "" || !strings.Contains(err.Error(), token) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), token, "<HF_TOKEN>"))
}

// errUnavailable is errdef.ErrUnavailable, which callers test for, in the Hub's words: the shared sentinel reads
// "registry unavailable", and a Hub is not a registry.
var errUnavailable error = hubUnavailable{}

type hubUnavailable struct{}

func (hubUnavailable) Error() string        { return "Hugging Face Hub unavailable" }
func (hubUnavailable) Is(target error) bool { return target == errdef.ErrUnavailable }

// jsonError is the message of a Hub error body ({"error": "..."}), or "".
func jsonError(b []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil {
		return ""
	}
	return e.Error
}
