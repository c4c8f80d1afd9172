package httplog

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestRedactHeader(t *testing.T) {
	for _, c := range []struct{ name, value, want string }{
		{"Authorization", "Bearer hf_secrettoken", "Bearer ***"},
		{"authorization", "Basic dXNlcjpwYXNz", "Basic ***"},
		{"Proxy-Authorization", "Basic dXNlcjpwYXNz", "Basic ***"},
		{"Authorization", "opaque", "***"},
		{"Cookie", "session=abc", "***"},
		{"Set-Cookie", "session=abc; HttpOnly", "***"},
		{"X-Amz-Security-Token", "FQoG", "***"},
		{"Www-Authenticate", `Bearer realm="https://auth/token",service="reg",scope="repository:a:pull"`, `Bearer realm="https://auth/token",service="reg",scope="repository:a:pull"`},
		{"Location", "https://cdn/x?X-Amz-Signature=abc&X-Amz-Credential=AKIA&part=1", "https://cdn/x?X-Amz-Credential=***&X-Amz-Signature=***&part=1"},
		{"Content-Type", "application/json", "application/json"},
	} {
		if got := RedactHeader(c.name, c.value); got != c.want {
			t.Errorf("RedactHeader(%q, %q) = %q, want %q", c.name, c.value, got, c.want)
		}
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://reg/token?scope=repository:a:pull&service=reg":      "https://reg/token?scope=repository:a:pull&service=reg",
		"https://reg/token?access_token=s3cr3t&scope=x":              "https://reg/token?access_token=***&scope=x",
		"https://hub/x?token=s3cr3t":                                 "https://hub/x?token=***",
		"https://cdn/o?Signature=s&Key-Pair-Id=k&Policy=p&Expires=1": "https://cdn/o?Expires=1&Key-Pair-Id=***&Policy=***&Signature=***",
		"https://blob.core/c?sig=s&se=2026":                          "https://blob.core/c?se=2026&sig=***",
		"https://user:pa55@reg/v2/":                                  "https://user:***@reg/v2/",
		"https://reg/v2/a/blobs/sha256:abc":                          "https://reg/v2/a/blobs/sha256:abc",
	} {
		u, err := url.Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := RedactURL(u); got != want {
			t.Errorf("RedactURL(%s) = %s, want %s", in, got, want)
		}
	}
}

// TestWrapLogsExchangesWithoutSecrets sends a request carrying every kind of credential through the logger to a
// real server answering with a cookie, and checks what was printed.
func TestWrapLogsExchangesWithoutSecrets(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "cookiesecret"})
		w.Header().Set("Www-Authenticate", `Bearer realm="r"`)
		w.WriteHeader(http.StatusTeapot)
		_, _ = io.WriteString(w, "bodysecret")
	}))
	defer srv.Close()
	var out bytes.Buffer
	c := &http.Client{Transport: New(&out).Wrap(http.DefaultTransport)}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v2/x?access_token=querysecret&n=1", nil)
	req.Header.Set("Authorization", "Bearer headersecret")
	req.Header.Set("Cookie", "a=cookiesecret2")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	got := out.String()
	for _, want := range []string{
		"[debug #1] > GET " + srv.URL + "/v2/x?access_token=***&n=1\n",
		"[debug #1] > Authorization: Bearer ***\n",
		"[debug #1] > Cookie: ***\n",
		"[debug #1] < HTTP/1.1 418 I'm a teapot (headers after ",
		"[debug #1] < Set-Cookie: ***\n",
		`[debug #1] < Www-Authenticate: Bearer realm="r"` + "\n",
		"[debug #1] < done in ",
		", 10 body bytes read\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("log lacks %q:\n%s", want, got)
		}
	}
	for _, secret := range []string{"querysecret", "headersecret", "cookiesecret", "bodysecret"} {
		if strings.Contains(got, secret) {
			t.Errorf("log shows %q:\n%s", secret, got)
		}
	}
}

// TestTimings checks the two times printed, with a clock that moves only when the exchange does: the time to the
// headers, then the total once the body is closed; a failed request prints its error, its URL redacted.
func TestTimings(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "abc") }))
	defer srv.Close()
	var out bytes.Buffer
	l := New(&out)
	clock := time.Unix(0, 0)
	l.now = func() time.Time { return clock }
	next := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		clock = clock.Add(5 * time.Millisecond)
		return http.DefaultTransport.RoundTrip(r)
	})
	resp, err := (&http.Client{Transport: l.Wrap(next)}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(2 * time.Millisecond)
	resp.Body.Close()
	for _, want := range []string{"[debug #1] < HTTP/1.1 200 OK (headers after 5ms)\n", "[debug #1] < done in 7ms, 0 body bytes read\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	srv.Close()
	if _, err := (&http.Client{Transport: l.Wrap(next)}).Get(srv.URL + "/x?token=querysecret"); err == nil {
		t.Fatal("a closed server answered")
	}
	if got := out.String(); !strings.Contains(got, "[debug #2] < error after 5ms: ") || strings.Contains(got, "querysecret") {
		t.Errorf("failed request's log:\n%s", got)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
