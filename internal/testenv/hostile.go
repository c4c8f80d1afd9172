package testenv

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// HostileRegistry is a hand-made registry (GET/HEAD of manifests and blobs, nothing else) serving whatever the
// test puts in it, lies included, with a hook per blob GET. The real registry refuses to store what these tests
// need: manifests whose descriptors lie, blobs that never arrive.
type HostileRegistry struct {
	Host string
	srv  *httptest.Server

	mu        sync.Mutex
	manifests map[string]served // by tag and digest
	blobs     map[digest.Digest][]byte
	gets      map[digest.Digest]int
	requests  int
	// OnBlob, if set, serves a blob GET instead of the default; it returns false to fall back to the default.
	OnBlob func(w http.ResponseWriter, r *http.Request, d digest.Digest, content []byte) bool
	// OnManifest is OnBlob for manifest GETs (by tag or digest).
	OnManifest func(w http.ResponseWriter, r *http.Request, reference string, content []byte) bool
}

type served struct {
	mediaType string
	b         []byte
}

// StartHostileRegistry starts one on loopback over plain HTTP, closed at test end.
func StartHostileRegistry(t testing.TB) *HostileRegistry {
	h := newHostile()
	h.srv = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.srv.Close)
	h.Host = strings.TrimPrefix(h.srv.URL, "http://")
	return h
}

// StartHostileRegistryTLS starts one over TLS with a certificate for 127.0.0.1 signed by its own CA, and returns
// the CA's PEM file.
func StartHostileRegistryTLS(t testing.TB) (*HostileRegistry, string) {
	h := newHostile()
	h.srv = httptest.NewTLSServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.srv.Close)
	h.Host = strings.TrimPrefix(h.srv.URL, "https://")
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: h.srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	return h, ca
}

func newHostile() *HostileRegistry {
	return &HostileRegistry{manifests: map[string]served{}, blobs: map[digest.Digest][]byte{}, gets: map[digest.Digest]int{}}
}

// Requests counts the requests the registry answered.
func (h *HostileRegistry) Requests() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.requests
}

// Close stops the server and cuts the connections of handlers still running.
func (h *HostileRegistry) Close() {
	h.srv.CloseClientConnections()
	h.srv.Close()
}

// Blob adds a blob and returns its descriptor (size as stored).
func (h *HostileRegistry) Blob(mediaType string, b []byte) ocispec.Descriptor {
	d := digest.FromBytes(b)
	h.mu.Lock()
	h.blobs[d] = b
	h.mu.Unlock()
	return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b))}
}

// Manifest adds m under its digest and tag and returns its descriptor.
func (h *HostileRegistry) Manifest(t testing.TB, tag string, m any, mediaType string) ocispec.Descriptor {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	d := digest.FromBytes(b)
	h.mu.Lock()
	h.manifests[d.String()] = served{mediaType, b}
	if tag != "" {
		h.manifests[tag] = served{mediaType, b}
	}
	h.mu.Unlock()
	return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b))}
}

// Raw adds b, served as is (however malformed), under its digest and tag.
func (h *HostileRegistry) Raw(tag, mediaType string, b []byte) ocispec.Descriptor {
	d := digest.FromBytes(b)
	h.mu.Lock()
	h.manifests[d.String()] = served{mediaType, b}
	if tag != "" {
		h.manifests[tag] = served{mediaType, b}
	}
	h.mu.Unlock()
	return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b))}
}

// Gets counts the GETs of blob d.
func (h *HostileRegistry) Gets(d digest.Digest) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gets[d]
}

func (h *HostileRegistry) serve(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.requests++
	h.mu.Unlock()
	w.Header().Set("Docker-Distribution-Api-Version", "registry/2.0")
	p := r.URL.Path
	if p == "/v2/" {
		return
	}
	if i := strings.LastIndex(p, "/manifests/"); i > 0 {
		h.mu.Lock()
		ref := p[i+len("/manifests/"):]
		m, ok := h.manifests[ref]
		hook := h.OnManifest
		h.mu.Unlock()
		if !ok {
			http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN"}]}`, http.StatusNotFound)
			return
		}
		if r.Method == http.MethodGet && hook != nil && hook(w, r, ref, m.b) {
			return
		}
		w.Header().Set("Content-Type", m.mediaType)
		w.Header().Set("Docker-Content-Digest", digest.FromBytes(m.b).String())
		w.Header().Set("Content-Length", jsonLen(m.b))
		if r.Method == http.MethodGet {
			w.Write(m.b)
		}
		return
	}
	if i := strings.LastIndex(p, "/blobs/"); i > 0 {
		d := digest.Digest(p[i+len("/blobs/"):])
		h.mu.Lock()
		b, ok := h.blobs[d]
		if r.Method == http.MethodGet {
			h.gets[d]++
		}
		hook := h.OnBlob
		h.mu.Unlock()
		if !ok {
			http.Error(w, `{"errors":[{"code":"BLOB_UNKNOWN"}]}`, http.StatusNotFound)
			return
		}
		if r.Method == http.MethodGet && hook != nil && hook(w, r, d, b) {
			return
		}
		w.Header().Set("Docker-Content-Digest", d.String())
		http.ServeContent(w, r, "", zeroTime, strings.NewReader(string(b)))
		return
	}
	http.NotFound(w, r)
}

var zeroTime time.Time

func jsonLen(b []byte) string { return strconv.Itoa(len(b)) }

// Push stores a blob or manifest (by media type), so fixtures built for a real registry can be served.
func (h *HostileRegistry) Push(_ context.Context, desc ocispec.Descriptor, r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch desc.MediaType {
	case ocispec.MediaTypeImageManifest, ocispec.MediaTypeImageIndex:
		h.manifests[digest.FromBytes(b).String()] = served{desc.MediaType, b}
	default:
		h.blobs[digest.FromBytes(b)] = b
	}
	return nil
}
