package remote

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/internal/testenv"
)

// A client given a Transports' transport reads through the hosts.toml mirrors as Repository does: tags from the
// mirrors that may resolve, digests and blobs from those that may pull, the origin after a miss; and the
// Authorization header the client made for the origin never reaches a mirror.
func TestTransportsReadsThroughMirrors(t *testing.T) {
	origin, _ := plainRegistry(t)
	type seen struct{ path, auth string }
	var mu sync.Mutex
	var got []seen
	mirror := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, seen{r.URL.Path, r.Header.Get("Authorization")})
		mu.Unlock()
		http.NotFound(w, r) // a miss: the origin must answer
	}))
	t.Cleanup(mirror.Close)
	mhost := strings.TrimPrefix(mirror.URL, "http://")
	hosts := t.TempDir()
	writeHosts(t, hosts, origin.Host, `[host."http://`+mhost+`"]
  capabilities = ["pull"]
`)
	rt := transportFor(t, Options{HostsDir: hosts}, origin.Host)
	get := func(path string) int {
		t.Helper()
		// go-containerregistry asks in https for a private address first: the configured scheme is used anyway.
		req, err := http.NewRequest(http.MethodGet, "https://"+origin.Host+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Basic b3JpZ2luOnNlY3JldA==")
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("/v2/"); code != http.StatusOK {
		t.Fatalf("ping: %d", code)
	}
	const dgst = "sha256:0000000000000000000000000000000000000000000000000000000000000000"
	for _, p := range []string{"/v2/lib/m/manifests/v1", "/v2/lib/m/manifests/" + dgst, "/v2/lib/m/blobs/" + dgst} {
		if code := get(p); code != http.StatusNotFound {
			t.Fatalf("GET %s: %d, want the origin's 404", p, code)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var paths []string
	for _, s := range got {
		if s.auth != "" {
			t.Errorf("the mirror was sent the origin's Authorization header on %s", s.path)
		}
		paths = append(paths, s.path)
	}
	// The ping went to the origin (up), the tag to no mirror (it may not resolve), the digests to the mirror.
	want := []string{"/v2/lib/m/manifests/" + dgst, "/v2/lib/m/blobs/" + dgst}
	if strings.Join(paths, " ") != strings.Join(want, " ") {
		t.Fatalf("the mirror was asked %v, want %v", paths, want)
	}
}

// Reads through Transports are bounded as the pull's are, by Timeouts.Idle however long ResponseHeader is: a
// blob whose response never starts (a hung endpoint) or whose body stops arriving fails with ErrUnavailable, once,
// not retried; and a hung mirror is passed for the origin.
func TestTransportsBoundsStalledReads(t *testing.T) {
	opts := Options{Timeouts: Timeouts{ResponseHeader: time.Hour, Idle: 200 * time.Millisecond}}
	content := []byte(strings.Repeat("signature payload ", 64))
	get := func(t *testing.T, o Options, host, path string) ([]byte, error) {
		t.Helper()
		rt := transportFor(t, o, host)
		// A backstop far beyond Idle, so that a regression fails with the wrong error instead of hanging.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t.Cleanup(cancel)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Basic b3JpZ2luOnNlY3JldA==") // the client authenticates: one request
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		return io.ReadAll(resp.Body)
	}
	blobPath := func(d digest.Digest) string { return "/v2/lib/m/blobs/" + d.String() }

	t.Run("hung origin", func(t *testing.T) {
		hung := testenv.StartHungServer(t)
		_, err := get(t, opts, hung.Host, blobPath(digest.FromBytes(content)))
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "no byte for") {
			t.Fatalf("blob from a hung origin: %v, want ErrUnavailable after the idle limit", err)
		}
		if n := hung.Accepted(); n != 1 {
			t.Fatalf("the hung origin got %d connections, want 1 (a stall is not retried)", n)
		}
	})
	t.Run("stalled body", func(t *testing.T) {
		origin := testenv.StartHostileRegistry(t)
		d := origin.Blob("application/octet-stream", content).Digest
		origin.OnBlob = func(w http.ResponseWriter, r *http.Request, _ digest.Digest, b []byte) bool {
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
			w.Write(b[:len(b)/2])
			w.(http.Flusher).Flush()
			<-r.Context().Done() // the rest never comes; the client hangs up
			return true
		}
		got, err := get(t, opts, origin.Host, blobPath(d))
		if !errors.Is(err, ErrUnavailable) || len(got) != len(content)/2 {
			t.Fatalf("stalled blob body: %d bytes, %v; want half of it and ErrUnavailable", len(got), err)
		}
	})
	t.Run("hung mirror", func(t *testing.T) {
		origin := testenv.StartHostileRegistry(t)
		d := origin.Blob("application/octet-stream", content).Digest
		hung := testenv.StartHungServer(t)
		o := opts
		o.HostsDir = t.TempDir()
		writeHosts(t, o.HostsDir, origin.Host, "[host.\"http://"+hung.Host+"\"]\n")
		got, err := get(t, o, origin.Host, blobPath(d))
		if err != nil || string(got) != string(content) {
			t.Fatalf("blob past a hung mirror: %d bytes, %v", len(got), err)
		}
		if hung.Accepted() != 1 {
			t.Fatalf("the hung mirror got %d connections, want 1: tried first, once", hung.Accepted())
		}
	})
}

// transportFor is the transport Transports give registry host under o, with host listed as plain HTTP.
func transportFor(t testing.TB, o Options, host string) http.RoundTripper {
	t.Helper()
	o.PlainHTTPHosts = append(o.PlainHTTPHosts, host)
	ts, err := NewTransports(o)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := ts.For(host)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}
