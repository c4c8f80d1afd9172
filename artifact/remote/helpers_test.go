package remote

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/testenv"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/oci"
)

// testModel is a small ModelPack artifact: two weight files, a config file and a tar layer of docs.
type testModel struct {
	files map[string][]byte // path in the model -> content (tar members included)
	store *oci.Store
	ref   string
	desc  ocispec.Descriptor
	blobs []ocispec.Descriptor // config and layers
}

func randBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// buildModel writes a ModelPack artifact tagged "v1" into a fresh OCI layout store.
func buildModel(t testing.TB, weightSize int) *testModel {
	t.Helper()
	ctx := context.Background()
	store, err := oci.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m := &testModel{files: map[string][]byte{}, store: store, ref: "v1"}
	push := func(mt string, b []byte, ann map[string]string) ocispec.Descriptor {
		d := content.NewDescriptorFromBytes(mt, b)
		d.Annotations = ann
		if err := store.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		m.blobs = append(m.blobs, d)
		return d
	}
	raw := func(kind artifact.Kind, name string, b []byte) ocispec.Descriptor {
		m.files[name] = b
		md, _ := json.Marshal(artifact.FileMetadata{Name: filepath.Base(name), Mode: 0o640, Size: int64(len(b)), Typeflag: tar.TypeReg})
		return push(artifact.LayerMediaType(kind, artifact.FormatRaw), b, map[string]string{
			artifact.AnnotationFilepath:     name,
			artifact.AnnotationTitle:        name,
			artifact.AnnotationFileMetadata: string(md),
		})
	}
	var layers []ocispec.Descriptor
	layers = append(layers, raw(artifact.KindWeight, "model-00001-of-00002.safetensors", randBytes(t, weightSize)))
	layers = append(layers, raw(artifact.KindWeight, "model-00002-of-00002.safetensors", randBytes(t, weightSize/2+17)))
	layers = append(layers, raw(artifact.KindWeightConfig, "config.json", []byte(`{"model_type":"llama"}`)))
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for _, f := range []struct{ name, body string }{{"docs/README.md", "# readme\n"}, {"docs/guide/usage.md", "use it\n"}} {
		tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(f.body))
		m.files[f.name] = []byte(f.body)
	}
	tw.Close()
	layers = append(layers, push(artifact.LayerMediaType(artifact.KindDoc, artifact.FormatTar), tb.Bytes(), map[string]string{
		artifact.AnnotationFilepath: "docs",
	}))
	var diffIDs []digest.Digest
	for _, l := range layers {
		diffIDs = append(diffIDs, l.Digest)
	}
	cfg, _ := json.Marshal(artifact.Model{
		Descriptor: artifact.ModelDescriptor{Name: "test-model"},
		ModelFS:    artifact.ModelFS{Type: "layers", DiffIDs: diffIDs},
		Config:     artifact.ModelConfig{Format: "safetensors"},
	})
	cfgDesc := push(artifact.MediaTypeModelConfig, cfg, nil)
	desc, err := oras.PackManifest(ctx, store, oras.PackManifestVersion1_1, artifact.ArtifactTypeModelManifest, oras.PackManifestOptions{
		Layers: layers, ConfigDescriptor: &cfgDesc,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Tag(ctx, desc, m.ref); err != nil {
		t.Fatal(err)
	}
	m.desc = desc
	return m
}

func (m *testModel) layerBytes() int64 {
	var n int64
	for _, b := range m.blobs {
		n += b.Size
	}
	return n
}

// checkFiles compares the model's files with what is under dir.
func (m *testModel) checkFiles(t testing.TB, dir string) {
	t.Helper()
	for name, want := range m.files {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("fetched file %s: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("fetched file %s differs (%d bytes, want %d)", name, len(got), len(want))
		}
	}
}

// casStore is a local store on cas (what layout.Store is): manifests and blobs in one verified blob directory,
// tags in memory. It is an Ingester, so pulls into it resume.
type casStore struct {
	*cas.Store
	mu   sync.Mutex
	tags map[string]ocispec.Descriptor
}

func newCASStore(t testing.TB) *casStore {
	s, err := cas.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &casStore{Store: s, tags: map[string]ocispec.Descriptor{}}
}

func (s *casStore) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	return s.Open(d.Digest)
}

func (s *casStore) Push(ctx context.Context, d ocispec.Descriptor, r io.Reader) error {
	return s.Ingest(ctx, d.Digest, d.Size, func(context.Context, int64) (io.ReadCloser, int64, error) {
		return io.NopCloser(r), 0, nil
	})
}

func (s *casStore) Exists(ctx context.Context, d ocispec.Descriptor) (bool, error) {
	return s.Store.Exists(d.Digest, d.Size)
}

func (s *casStore) Tag(ctx context.Context, d ocispec.Descriptor, ref string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tags[ref] = d
	return nil
}

func (s *casStore) Resolve(ctx context.Context, ref string) (ocispec.Descriptor, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.tags[ref]
	if !ok {
		return d, os.ErrNotExist
	}
	return d, nil
}

func (s *casStore) has(t testing.TB, d ocispec.Descriptor) bool {
	ok, err := s.Store.Exists(d.Digest, d.Size)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// plainRegistry starts a registry and returns it with options reaching it over plain HTTP.
func plainRegistry(t testing.TB) (*testenv.Registry, Options) {
	t.Helper()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	return reg, Options{PlainHTTP: true, RegistryConfig: filepath.Join(t.TempDir(), "config.json")}
}

func repoFor(t testing.TB, ref string, opts Options) *Repository {
	t.Helper()
	r, _, err := NewRepository(ref, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// countingProxy forwards to a registry and counts the blob bytes it sends back, optionally slowly, and can act
// once a blob has sent a given number of bytes.
type countingProxy struct {
	*testenv.Proxy
	blobBytes  atomic.Int64
	ranges     atomic.Int64
	putBytes   atomic.Int64
	delay      atomic.Int64  // nanoseconds of sleep per 64 KiB of blob body
	onBytes    int64         // when a blob response has sent this many bytes...
	fire       chan struct{} // ...this is closed (once)
	fired      atomic.Bool
	stallAfter int64 // the first blob response to send this many bytes then hangs until the client gives up
	stalled    atomic.Bool
	mu         sync.Mutex
	failPaths  map[string]int // path substring -> responses to fail with 500
	failedOnce map[string]int
	ns         []string // the ns query parameters of requests (which registry a mirror was asked for)
}

func newCountingProxy(t testing.TB, target string) *countingProxy {
	t.Helper()
	p := &countingProxy{fire: make(chan struct{}), failPaths: map[string]int{}, failedOnce: map[string]int{}}
	p.Proxy = testenv.StartProxy(t, target, testenv.ProxyHooks{
		Request: func(w http.ResponseWriter, r *http.Request) bool {
			if r.Header.Get("Range") != "" {
				p.ranges.Add(1)
			}
			p.mu.Lock()
			if ns := r.URL.Query().Get("ns"); ns != "" {
				p.ns = append(p.ns, ns)
			}
			for sub, n := range p.failPaths {
				if strings.Contains(r.URL.Path, sub) && p.failedOnce[sub] < n {
					p.failedOnce[sub]++
					p.mu.Unlock()
					http.Error(w, "injected failure", http.StatusInternalServerError)
					return false
				}
			}
			p.mu.Unlock()
			if r.Method == http.MethodPut && r.Body != nil {
				r.Body = &countBody{ReadCloser: r.Body, n: &p.putBytes}
			}
			return true
		},
		Response: func(resp *http.Response) {
			if resp.Request.Method == http.MethodGet && strings.Contains(resp.Request.URL.Path, "/blobs/") {
				resp.Body = &proxyBody{ReadCloser: resp.Body, p: p, ctx: resp.Request.Context()}
			}
		},
	})
	return p
}

func (p *countingProxy) host() string { return p.Host }

type proxyBody struct {
	io.ReadCloser
	ctx  context.Context
	p    *countingProxy
	sent int64
	acc  int64
}

func (b *proxyBody) Read(q []byte) (int, error) {
	n, err := b.ReadCloser.Read(q)
	b.p.blobBytes.Add(int64(n))
	b.sent += int64(n)
	b.acc += int64(n)
	if d := time.Duration(b.p.delay.Load()); d > 0 && b.acc >= 64<<10 {
		time.Sleep(d)
		b.acc = 0
	}
	if b.p.stallAfter > 0 && b.sent >= b.p.stallAfter && b.p.stalled.CompareAndSwap(false, true) {
		<-b.ctx.Done()
		return n, b.ctx.Err()
	}
	if b.p.onBytes > 0 && b.sent >= b.p.onBytes && b.p.fired.CompareAndSwap(false, true) {
		close(b.p.fire)
	}
	return n, err
}

type countBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countBody) Read(q []byte) (int, error) {
	n, err := b.ReadCloser.Read(q)
	b.n.Add(int64(n))
	return n, err
}

// recorder is a Reporter that keeps the final status of each blob.
type recorder struct {
	mu     sync.Mutex
	status map[digest.Digest]Status
	starts map[digest.Digest]int64
}

func newRecorder() *recorder {
	return &recorder{status: map[digest.Digest]Status{}, starts: map[digest.Digest]int64{}}
}

func (r *recorder) Start(d ocispec.Descriptor, done int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts[d.Digest] = done
}
func (r *recorder) Update(ocispec.Descriptor, int64) {}
func (r *recorder) Finish(d ocispec.Descriptor, s Status, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status[d.Digest] = s
}

// newNotRegistry starts a web server that is no registry (404 everywhere) and returns its host:port.
func newNotRegistry(t testing.TB) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, "<html>nothing here</html>")
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}
