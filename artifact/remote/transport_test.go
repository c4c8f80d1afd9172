package remote

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// A client given TransportsFor's transport reads through the hosts.toml mirrors as Repository does: tags from the
// mirrors that may resolve, digests and blobs from those that may pull, the origin after a miss; and the
// Authorization header the client made for the origin never reaches a mirror.
func TestTransportsForReadsThroughMirrors(t *testing.T) {
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
	rt, err := TransportsFor(Options{HostsDir: hosts}, []string{origin.Host})(origin.Host)
	if err != nil {
		t.Fatal(err)
	}
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
