package remote

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func writeHosts(t testing.TB, dir, host, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, host), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, host, "hosts.toml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestHostsFileParsing(t *testing.T) {
	dir := t.TempDir()
	writeHosts(t, dir, "registry.example.com", `
server = "https://origin.example.com"
ca = "origin-ca.pem"

[host."http://zz-mirror.local:5000"]
  capabilities = ["pull", "resolve"]
  [host."http://zz-mirror.local:5000".header]
    X-Dragonfly-Registry = "https://origin.example.com"

[host."https://aa-mirror.local/v2/proxy"]
  capabilities = ["pull"]
  override_path = true
  skip_verify = true
  ca = ["/abs/ca.pem", "rel/ca.pem"]
  client = [["c.pem", "c.key"]]
`)
	eps, err := loadEndpoints(Options{HostsDir: dir}, "registry.example.com")
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 3 {
		t.Fatalf("got %d endpoints, want 2 mirrors and the origin", len(eps))
	}
	// Mirrors keep file order, not alphabetical order.
	z, a, o := eps[0], eps[1], eps[2]
	if z.host != "zz-mirror.local:5000" || z.scheme != "http" || !z.pull || !z.resolve || z.push || !z.mirror {
		t.Fatalf("first mirror: %+v", z)
	}
	if z.header.Get("X-Dragonfly-Registry") != "https://origin.example.com" {
		t.Fatalf("mirror header: %v", z.header)
	}
	if a.host != "aa-mirror.local" || a.path != "/v2/proxy" || !a.overridePath || !a.skipVerify || a.resolve || !a.pull {
		t.Fatalf("second mirror: %+v", a)
	}
	if !reflect.DeepEqual(a.caFiles, []string{"/abs/ca.pem", filepath.Join(dir, "registry.example.com", "rel/ca.pem")}) {
		t.Fatalf("ca files: %v", a.caFiles)
	}
	if len(a.clientPairs) != 1 || a.clientPairs[0][1] != filepath.Join(dir, "registry.example.com", "c.key") {
		t.Fatalf("client pairs: %v", a.clientPairs)
	}
	if o.host != "origin.example.com" || o.mirror || !o.push || o.caFiles[0] != filepath.Join(dir, "registry.example.com", "origin-ca.pem") {
		t.Fatalf("origin: %+v", o)
	}

	// No file for the host and no _default: the origin alone, as configured by the options.
	eps, err = loadEndpoints(Options{HostsDir: dir, PlainHTTP: true}, "other:5000")
	if err != nil || len(eps) != 1 || eps[0].scheme != "http" || eps[0].host != "other:5000" {
		t.Fatalf("no hosts file: %+v, %v", eps, err)
	}
	writeHosts(t, dir, "_default", `[host."http://cache.local"]`+"\n")
	eps, err = loadEndpoints(Options{HostsDir: dir}, "other:5000")
	if err != nil || len(eps) != 2 || eps[0].host != "cache.local" {
		t.Fatalf("_default: %+v, %v", eps, err)
	}

	writeHosts(t, dir, "bad", "[host.\"http://m\"]\ncapabilities = [\"fly\"]\n")
	if _, err := loadEndpoints(Options{HostsDir: dir}, "bad"); err == nil || !strings.Contains(err.Error(), "fly") {
		t.Fatalf("unknown capability: %v", err)
	}
}

func TestMirrorFirstThenOrigin(t *testing.T) {
	ctx := context.Background()
	origin, opts := plainRegistry(t)
	mirror, _ := plainRegistry(t)
	mp := newCountingProxy(t, mirror.Host)
	m := buildModel(t, 1<<20)
	if _, err := Push(ctx, m.store, m.ref, repoFor(t, origin.Host+"/lib/model:v1", opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	hosts := t.TempDir()
	writeHosts(t, hosts, origin.Host, `server = "http://`+origin.Host+`"

[host."http://`+mp.host()+`"]
  capabilities = ["pull", "resolve"]
`)
	viaHosts := opts
	viaHosts.HostsDir = hosts

	// The mirror lacks the model: reads fall back to the origin.
	dir := t.TempDir()
	if _, err := Fetch(ctx, repoFor(t, origin.Host+"/lib/model:v1", viaHosts), dir, FetchOptions{}); err != nil {
		t.Fatalf("fetch with a mirror missing the model: %v", err)
	}
	m.checkFiles(t, dir)
	mp.mu.Lock()
	firstNS := append([]string(nil), mp.ns...)
	mp.mu.Unlock()
	if len(firstNS) == 0 || firstNS[0] != origin.Host {
		t.Fatalf("the mirror was not asked first with ns=%s: %v", origin.Host, firstNS)
	}

	// Once the mirror has it, the origin is not needed.
	if _, err := Copy(ctx, repoFor(t, origin.Host+"/lib/model:v1", opts), repoFor(t, mirror.Host+"/lib/model:v1", opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	origin.Stop()
	before := mp.blobBytes.Load()
	local := newCASStore(t)
	if _, err := Pull(ctx, repoFor(t, origin.Host+"/lib/model:v1", viaHosts), local, "model:v1", TransferOptions{}); err != nil {
		t.Fatalf("pull through the mirror with the origin down: %v", err)
	}
	if got := mp.blobBytes.Load() - before; got != m.layerBytes() {
		t.Fatalf("the mirror served %d blob bytes, want %d", got, m.layerBytes())
	}
	// Writes go to the origin only, which is down.
	if _, err := Push(ctx, m.store, m.ref, repoFor(t, origin.Host+"/lib/model:v2", viaHosts), TransferOptions{}); Classify(err) != ErrUnavailable {
		t.Fatalf("push with the origin down: %v, want unavailable", err)
	}
}

// A pull and a signature read choose mirrors by one rule (endpoint.serves): a mirror that may pull but not resolve
// serves a manifest named by digest, never one named by tag. Repository used to ask only resolve-capable mirrors
// for a manifest by digest, unlike the signature transport, so with the origin down the same digest was read by
// one and not the other.
func TestMirrorCapabilitiesAreOneRule(t *testing.T) {
	ctx := context.Background()
	origin, opts := plainRegistry(t)
	mirror, _ := plainRegistry(t)
	m := buildModel(t, 1<<10)
	res, err := Push(ctx, m.store, m.ref, repoFor(t, origin.Host+"/lib/model:v1", opts), TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Copy(ctx, repoFor(t, origin.Host+"/lib/model:v1", opts), repoFor(t, mirror.Host+"/lib/model:v1", opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	hosts := t.TempDir()
	writeHosts(t, hosts, origin.Host, `[host."http://`+mirror.Host+`"]
  capabilities = ["pull"]
`)
	viaHosts := opts
	viaHosts.HostsDir = hosts
	origin.Stop()

	repo := repoFor(t, origin.Host+"/lib/model:v1", viaHosts)
	rt := transportFor(t, viaHosts, origin.Host)
	for _, ref := range []string{res.Descriptor.Digest.String(), "v1"} {
		want := ref != "v1"
		_, rerr := repo.Resolve(ctx, ref)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+origin.Host+"/v2/lib/model/manifests/"+ref, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept", ocispec.MediaTypeImageManifest)
		resp, terr := rt.RoundTrip(req)
		if terr == nil {
			resp.Body.Close()
		}
		tok := terr == nil && resp.StatusCode == http.StatusOK
		if (rerr == nil) != want || tok != want {
			t.Errorf("manifest %s with the origin down and a pull-only mirror: pull %v, signature read ok=%v (%v); want served=%v by both",
				ref, rerr, tok, terr, want)
		}
	}
}
