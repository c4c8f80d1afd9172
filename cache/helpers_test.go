package cache

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/errdef"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/internal/testenv"
)

// proxy is a counting (and optionally throttling) reverse proxy in front of a real registry: it records every
// request and the bytes of every response body, per URL path.
type proxy struct {
	Host string

	mu       sync.Mutex
	gets     map[string]int
	ranges   map[string][]string // Range headers of GETs, per path
	bytes    map[string]int64
	rate     atomic.Int64 // bytes per second per response; 0 = unthrottled
	blobGets atomic.Int64
}

func newProxy(t testing.TB, upstream string) *proxy {
	t.Helper()
	p := &proxy{gets: map[string]int{}, ranges: map[string][]string{}, bytes: map[string]int64{}}
	p.Host = testenv.StartProxy(t, upstream, testenv.ProxyHooks{
		Request: func(_ http.ResponseWriter, r *http.Request) bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			if r.Method == http.MethodGet {
				p.gets[r.URL.Path]++
				if rg := r.Header.Get("Range"); rg != "" {
					p.ranges[r.URL.Path] = append(p.ranges[r.URL.Path], rg)
				}
				if strings.Contains(r.URL.Path, "/blobs/") {
					p.blobGets.Add(1)
				}
			}
			return true
		},
		Response: func(resp *http.Response) {
			resp.Body = &countBody{ReadCloser: resp.Body, p: p, path: resp.Request.URL.Path}
		},
	}).Host
	return p
}

type countBody struct {
	io.ReadCloser
	p    *proxy
	path string
}

func (b *countBody) Read(buf []byte) (int, error) {
	if rate := b.p.rate.Load(); rate > 0 {
		if len(buf) > 32<<10 {
			buf = buf[:32<<10]
		}
		time.Sleep(time.Duration(int64(len(buf)) * int64(time.Second) / rate))
	}
	n, err := b.ReadCloser.Read(buf)
	b.p.mu.Lock()
	b.p.bytes[b.path] += int64(n)
	b.p.mu.Unlock()
	return n, err
}

func (p *proxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gets, p.ranges, p.bytes = map[string]int{}, map[string][]string{}, map[string]int64{}
	p.blobGets.Store(0)
}

// blobBytes is the total of blob response bodies since the last reset.
func (p *proxy) blobBytes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for path, b := range p.bytes {
		if strings.Contains(path, "/blobs/") {
			n += b
		}
	}
	return n
}

func (p *proxy) getCounts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for k, v := range p.gets {
		out[k] = v
	}
	return out
}

// newRepo is the plain-HTTP test registry's repository name, read as the driver reads (artifact/remote), with no
// credentials.
func newRepo(t testing.TB, host, name string) *remote.Repository {
	t.Helper()
	r, _, err := remote.NewRepository(host+"/"+name, remote.Options{PlainHTTP: true, RegistryConfig: filepath.Join(t.TempDir(), "config.json")})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// modelFile is a file of a test model: raw by default, or a tar layer (Format) holding Tar entries.
type modelFile struct {
	Path   string
	Data   []byte
	Kind   artifact.Kind
	Format artifact.Format
}

// pusher is where fixtures go: a real registry repository or an in-memory hostile target.
type pusher interface {
	Push(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error
}

func pushBlob(t testing.TB, p pusher, mediaType string, data []byte, annotations map[string]string) ocispec.Descriptor {
	t.Helper()
	d := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data)), Annotations: annotations}
	if err := p.Push(context.Background(), d, bytes.NewReader(data)); err != nil && !errors.Is(err, errdef.ErrAlreadyExists) {
		t.Fatal(err)
	}
	return d
}

// modelManifest builds and pushes the layers and config of a ModelPack model and returns its manifest bytes.
func modelManifest(t testing.TB, p pusher, files []modelFile) []byte {
	t.Helper()
	var layers []ocispec.Descriptor
	var diffs []digest.Digest
	for _, f := range files {
		format := f.Format
		if format == "" {
			format = artifact.FormatRaw
		}
		kind := f.Kind
		if kind == "" {
			kind = artifact.KindOf(f.Path)
		}
		ann := map[string]string{artifact.AnnotationFilepath: f.Path, artifact.AnnotationTitle: filepath.Base(f.Path)}
		layers = append(layers, pushBlob(t, p, artifact.LayerMediaType(kind, format), f.Data, ann))
		diffs = append(diffs, digest.FromBytes(f.Data))
	}
	cfg, _ := json.Marshal(artifact.Model{ModelFS: artifact.ModelFS{Type: "layers", DiffIDs: diffs}, Config: artifact.ModelConfig{Format: "safetensors"}})
	m := ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: artifact.ArtifactTypeModelManifest,
		Config:       pushBlob(t, p, artifact.MediaTypeModelConfig, cfg, nil),
		Layers:       layers,
	}
	b, _ := json.Marshal(m)
	return b
}

// pushModel pushes a model to a registry repository under tag and returns its manifest descriptor.
func pushModel(t testing.TB, repo *remote.Repository, tag string, files []modelFile) ocispec.Descriptor {
	t.Helper()
	b := modelManifest(t, repo, files)
	return pushManifest(t, repo, tag, ocispec.MediaTypeImageManifest, b)
}

func pushManifest(t testing.TB, repo *remote.Repository, tag, mediaType string, b []byte) ocispec.Descriptor {
	t.Helper()
	d := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
	if err := repo.PushReference(context.Background(), d, bytes.NewReader(b), tag); err != nil {
		t.Fatal(err)
	}
	return d
}

// shard is deterministic pseudo-random content.
func shard(seed byte, size int) []byte {
	b := make([]byte, size)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

type tarEntry struct {
	Name, Link string
	Type       byte
	Mode       int64
	Body       string
}

func makeTar(t testing.TB, gz bool, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, e := range entries {
		typ := e.Type
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.Mode
		if mode == 0 {
			mode = 0o644
		}
		size := int64(0)
		if typ == tar.TypeReg {
			size = int64(len(e.Body))
		}
		if err := tw.WriteHeader(&tar.Header{Name: e.Name, Linkname: e.Link, Typeflag: typ, Mode: mode, Size: size, ModTime: time.Unix(1e9, 0)}); err != nil {
			t.Fatal(err)
		}
		if size > 0 {
			tw.Write([]byte(e.Body))
		}
	}
	tw.Close()
	if zw != nil {
		zw.Close()
	}
	return buf.Bytes()
}

// memTarget is an oras.ReadOnlyTarget that serves whatever bytes it was given under whatever descriptor: a hostile
// registry, which the real one would not let us be.
type memTarget struct {
	mu    sync.Mutex
	blobs map[digest.Digest][]byte
	gets  map[digest.Digest]int
}

func newMemTarget() *memTarget {
	return &memTarget{blobs: map[digest.Digest][]byte{}, gets: map[digest.Digest]int{}}
}

func (m *memTarget) Push(_ context.Context, d ocispec.Descriptor, r io.Reader) error {
	b, err := io.ReadAll(r)
	m.mu.Lock()
	m.blobs[d.Digest] = b
	m.mu.Unlock()
	return err
}

// put stores b under d regardless of whether they match.
func (m *memTarget) put(d digest.Digest, b []byte) {
	m.mu.Lock()
	m.blobs[d] = b
	m.mu.Unlock()
}

func (m *memTarget) Fetch(_ context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.blobs[d.Digest]
	if !ok {
		return nil, fmt.Errorf("%s: %w", d.Digest, errdef.ErrNotFound)
	}
	m.gets[d.Digest]++
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (m *memTarget) Exists(_ context.Context, d ocispec.Descriptor) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.blobs[d.Digest]
	return ok, nil
}

func (m *memTarget) Resolve(context.Context, string) (ocispec.Descriptor, error) {
	return ocispec.Descriptor{}, errdef.ErrNotFound
}

// manifestDesc stores manifest bytes in the target and returns their descriptor.
func (m *memTarget) manifestDesc(b []byte) ocispec.Descriptor {
	d := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(b), Size: int64(len(b))}
	m.put(d.Digest, b)
	return d
}

func openCache(t testing.TB, root string, opts Options) *Cache {
	t.Helper()
	opts.Root = root
	c, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// listTree lists a directory as testenv.Tree does, a file's content as the first 12 hex digits of its digest.
func listTree(t testing.TB, dir string) []string {
	t.Helper()
	return testenv.Tree(t, dir, func(b []byte) string { return digest.FromBytes(b).Encoded()[:12] })
}

// onlyChild fails the test if parent holds anything but name: nothing was written outside the cache root.
func onlyChild(t testing.TB, parent, name string) {
	t.Helper()
	entries, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != name {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("written outside the cache root: %v", names)
	}
}

func startRegistry(t testing.TB) *testenv.Registry {
	return testenv.StartRegistry(t, testenv.RegistryOptions{})
}

// mirroredRepo is the repository m/model:v1 of the plain-HTTP registry origin read through a hosts.toml that
// puts mirror first, with timeouts tm and no credentials.
func mirroredRepo(t testing.TB, origin, mirror string, tm remote.Timeouts) *remote.Repository {
	t.Helper()
	hosts := t.TempDir()
	os.MkdirAll(filepath.Join(hosts, origin), 0o755)
	os.WriteFile(filepath.Join(hosts, origin, "hosts.toml"), []byte(`server = "http://`+origin+`"

[host."http://`+mirror+`"]
  capabilities = ["pull", "resolve"]
`), 0o644)
	repo, _, err := remote.NewRepository(origin+"/m/model:v1", remote.Options{PlainHTTP: true, HostsDir: hosts,
		RegistryConfig: filepath.Join(t.TempDir(), "config.json"), Timeouts: tm})
	if err != nil {
		t.Fatal(err)
	}
	return repo
}
