package layout_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/oci"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/layout"
	"github.com/modelpack/modelpack/artifact/pack"
	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

func TestParseReference(t *testing.T) {
	for in, want := range map[string]string{
		"llama3":                        "llama3:latest",
		"llama3:8b":                     "llama3:8b",
		"org/model:v1":                  "org/model:v1",
		"registry.local:5000/org/model": "registry.local:5000/org/model:latest",
		"localhost/m:1":                 "localhost/m:1",
		"org/m@sha256:" + strings.Repeat("a", 64): "org/m@sha256:" + strings.Repeat("a", 64),
	} {
		got, err := layout.ParseReference(in)
		if err != nil || got != want {
			t.Errorf("ParseReference(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "Llama3", "a b", "org/:v1", "m:bad tag", "m@sha256:zz", "/m", "m:"} {
		_, err := layout.ParseReference(in)
		if !errors.Is(err, errdef.ErrInvalidReference) || !strings.Contains(err.Error(), fmt.Sprintf("%q", in)) {
			t.Errorf("ParseReference(%q): %v", in, err)
		}
	}
}

func newStore(t *testing.T) *layout.Store {
	t.Helper()
	s, err := layout.Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func packSample(t *testing.T, s *layout.Store, tag string, seed uint64) ocispec.Descriptor {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Generate(dir, testmodel.Spec{Shards: 2, ShardSize: 4096, Seed: seed}); err != nil {
		t.Fatal(err)
	}
	desc, err := pack.Pack(context.Background(), dir, pack.Options{Tag: tag}, s.Sink())
	if err != nil {
		t.Fatal(err)
	}
	return desc
}

func TestLayoutFiles(t *testing.T) {
	s := newStore(t)
	desc := packSample(t, s, "m:v1", 1)
	var l ocispec.ImageLayout
	b, err := os.ReadFile(filepath.Join(s.Root(), "oci-layout"))
	if err != nil || json.Unmarshal(b, &l) != nil || l.Version != "1.0.0" {
		t.Fatalf("oci-layout: %s %v", b, err)
	}
	var idx ocispec.Index
	b, _ = os.ReadFile(filepath.Join(s.Root(), "index.json"))
	if err := json.Unmarshal(b, &idx); err != nil {
		t.Fatal(err)
	}
	if idx.SchemaVersion != 2 || len(idx.Manifests) != 1 || idx.Manifests[0].Digest != desc.Digest || idx.Manifests[0].Annotations[ocispec.AnnotationRefName] != "m:v1" {
		t.Fatalf("index.json: %s", b)
	}
	// oras-go's own OCI layout reader agrees.
	o, err := oci.NewFromFS(context.Background(), os.DirFS(s.Root()))
	if err != nil {
		t.Fatal(err)
	}
	got, err := o.Resolve(context.Background(), "m:v1")
	if err != nil || got.Digest != desc.Digest {
		t.Fatalf("oras-go oci.Store resolves %v, %v", got, err)
	}
}

func TestTagResolveUntag(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	a := packSample(t, s, "m:v1", 1)
	b := packSample(t, s, "m:v2", 2)
	if err := s.Tag(ctx, a, "m"); err != nil {
		t.Fatal(err)
	}
	for ref, want := range map[string]digest.Digest{"m:v1": a.Digest, "m:v2": b.Digest, "m": a.Digest, "m:latest": a.Digest, a.Digest.String(): a.Digest, "m@" + b.Digest.String(): b.Digest} {
		got, err := s.Resolve(ctx, ref)
		if err != nil || got.Digest != want || got.MediaType != ocispec.MediaTypeImageManifest || got.Size == 0 {
			t.Errorf("Resolve(%q) = %v, %v; want %s", ref, got, err, want)
		}
	}
	// Retagging moves the tag.
	if err := s.Tag(ctx, b, "m:v1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Resolve(ctx, "m:v1"); got.Digest != b.Digest {
		t.Fatalf("m:v1 did not move")
	}
	var tags []string
	s.Tags(ctx, "", func(t []string) error { tags = append(tags, t...); return nil })
	if strings.Join(tags, ",") != "m:latest,m:v1,m:v2" {
		t.Fatalf("tags %v", tags)
	}
	tags = nil
	s.Tags(ctx, "m:v1", func(t []string) error { tags = append(tags, t...); return nil })
	if strings.Join(tags, ",") != "m:v2" {
		t.Fatalf("tags after m:v1: %v", tags)
	}
	if err := s.Untag(ctx, "m:v2"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(ctx, "m:v2"); !errors.Is(err, errdef.ErrNotFound) {
		t.Fatalf("resolve after untag: %v", err)
	}
	if err := s.Untag(ctx, "m:v2"); !errors.Is(err, errdef.ErrNotFound) {
		t.Fatalf("second untag: %v", err)
	}
	missing := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("x"), Size: 1}
	if err := s.Tag(ctx, missing, "m:x"); !errors.Is(err, errdef.ErrNotFound) {
		t.Fatalf("tagging a missing manifest: %v", err)
	}
	if err := s.Tag(ctx, a, "m@"+b.Digest.String()); !errors.Is(err, errdef.ErrInvalidReference) {
		t.Fatalf("tagging with another digest: %v", err)
	}
}

// Concurrent taggers in several processes must not lose each other's tags: index.json is updated under a lock.
func TestConcurrentTags(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	desc := packSample(t, s, "m:v0", 1)
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A separate Store is what another process has: its own locks and file handles.
			o, err := layout.Open(s.Root())
			if err != nil {
				t.Error(err)
				return
			}
			defer o.Close()
			if err := o.Tag(ctx, desc, fmt.Sprintf("m:t%d", i)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	entries, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 21 {
		t.Fatalf("%d tags, want 21", len(entries))
	}
}

func TestPrune(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	a := packSample(t, s, "m:a", 1)
	b := packSample(t, s, "m:b", 2)
	// A referrer of a (a signature-like manifest with a subject), pushed untagged.
	sig := pushManifest(t, s, &a, []byte("sig"))
	// A leftover of an interrupted pack: a blob no manifest reaches.
	orphan := []byte("orphan")
	if err := s.Push(ctx, ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(orphan), Size: int64(len(orphan))}, bytes.NewReader(orphan)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	stats, err := s.Prune(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Blobs != 1 || stats.Bytes != int64(len(orphan)) {
		t.Fatalf("pruned %+v, want only the orphan", stats)
	}
	if ok, _ := s.Exists(ctx, sig); !ok {
		t.Fatal("referrer of a tagged manifest pruned")
	}
	preds, err := s.Predecessors(ctx, a)
	if err != nil || len(preds) != 1 || preds[0].Digest != sig.Digest {
		t.Fatalf("Predecessors(a) = %v, %v; want the referrer", preds, err)
	}
	if preds, _ := s.Predecessors(ctx, b); len(preds) != 0 {
		t.Fatalf("Predecessors(b) = %v", preds)
	}
	// Untag a: its unique blobs and its referrer go, b stays whole.
	if err := s.Untag(ctx, "m:a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range []ocispec.Descriptor{a, sig} {
		if ok, _ := s.Exists(ctx, d); ok {
			t.Errorf("%s survived prune", d.Digest)
		}
	}
	out := t.TempDir()
	m := fetchManifest(t, s, b)
	if _, err := pack.Unpack(ctx, s, m, out, pack.UnpackOptions{}); err != nil {
		t.Fatalf("b damaged by prune: %v", err)
	}
	// Nothing but b's blobs remain.
	n := 0
	filepath.WalkDir(filepath.Join(s.Root(), "blobs"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return nil
	})
	if n != len(m.Layers)+2 {
		t.Fatalf("%d blobs left, want %d", n, len(m.Layers)+2)
	}
}

// Prune in one process waits for a writer in another, so a pack in progress keeps its untagged blobs.
func TestPruneWaitsForWriters(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	blob := []byte("in flight")
	d := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(blob), Size: int64(len(blob))}
	if err := s.Push(ctx, d, bytes.NewReader(blob)); err != nil { // takes the writer lock until Close
		t.Fatal(err)
	}
	other, err := layout.Open(s.Root())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	short, cancel := context.WithTimeout(ctx, 200_000_000)
	defer cancel()
	if _, err := other.Prune(short); err == nil {
		t.Fatal("prune ran while another store was writing")
	}
	if ok, _ := s.Exists(ctx, d); !ok {
		t.Fatal("in-flight blob deleted")
	}
	s.Close()
	if st, err := other.Prune(ctx); err != nil || st.Blobs != 1 {
		t.Fatalf("prune after the writer closed: %+v %v", st, err)
	}
}

func TestDelete(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	a := packSample(t, s, "m:a", 1)
	if err := s.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(ctx, "m:a"); !errors.Is(err, errdef.ErrNotFound) {
		t.Fatalf("tag of a deleted manifest: %v", err)
	}
	if err := s.Delete(ctx, a); !errors.Is(err, errdef.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := s.Fetch(ctx, a); !errors.Is(err, errdef.ErrNotFound) {
		t.Fatalf("fetch after delete: %v", err)
	}
}

func TestPushVerifies(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	b := []byte("content")
	d := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(b), Size: int64(len(b))}
	if err := s.Push(ctx, d, bytes.NewReader([]byte("tampered"))); err == nil {
		t.Fatal("pushed bytes that do not match the descriptor")
	}
	if ok, _ := s.Exists(ctx, d); ok {
		t.Fatal("mismatched content stored")
	}
	if err := s.Push(ctx, d, bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	got, err := content.FetchAll(ctx, s, d)
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("fetch: %q %v", got, err)
	}
}

// oras.Copy moves an artifact from the store to a real registry and back, byte for byte.
func TestOrasCopyWithRegistry(t *testing.T) {
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	s := newStore(t)
	desc := packSample(t, s, "m:v1", 3)
	repo, err := remote.NewRepository(reg.Host + "/test/model")
	if err != nil {
		t.Fatal(err)
	}
	repo.PlainHTTP = true
	if _, err := oras.Copy(ctx, s, "m:v1", repo, "v1", oras.DefaultCopyOptions); err != nil {
		t.Fatal(err)
	}
	back := newStore(t)
	got, err := oras.Copy(ctx, repo, "v1", back, reg.Host+"/test/model:v1", oras.DefaultCopyOptions)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != desc.Digest {
		t.Fatalf("digest changed in the round trip: %s != %s", got.Digest, desc.Digest)
	}
	if r, err := back.Resolve(ctx, reg.Host+"/test/model:v1"); err != nil || r.Digest != desc.Digest {
		t.Fatalf("copied tag: %v %v", r, err)
	}
	m := fetchManifest(t, back, got)
	for _, l := range append(m.Layers, m.Config) {
		if ok, err := back.Exists(ctx, l); !ok || err != nil {
			t.Fatalf("blob %s missing after copy: %v", l.Digest, err)
		}
	}
}

// The real oras CLI reads the store as an OCI layout and writes the files under their original names.
func TestOrasCLIPull(t *testing.T) {
	orasBin := testenv.Tool(t, "oras")
	s := newStore(t)
	dir := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Generate(dir, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dir, "src"), 0o755)
	os.WriteFile(filepath.Join(dir, "src", "infer.py"), []byte("print('hi')\n"), 0o644)
	desc, err := pack.Pack(context.Background(), dir, pack.Options{Tag: "org/model:v1"}, s.Sink())
	if err != nil {
		t.Fatal(err)
	}
	// oras copy reads the store as a layout and pushes to a registry, from which oras pull writes the files too.
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	if b, err := exec.Command(orasBin, "copy", "--from-oci-layout-path", s.Root(), "org/model:v1", "--to-plain-http", reg.Host+"/copied/model:v1").CombinedOutput(); err != nil {
		t.Fatalf("oras copy from the store: %v\n%s", err, b)
	}
	for name, args := range map[string][]string{
		"by reference":       {"pull", "--oci-layout-path", s.Root(), "org/model:v1"},
		"by digest":          {"pull", "--oci-layout", s.Root() + "@" + desc.Digest.String()},
		"copied to registry": {"pull", "--plain-http", reg.Host + "/copied/model:v1"},
	} {
		out := t.TempDir()
		cmd := exec.Command(orasBin, append(args, "-o", out)...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: oras %v: %v\n%s", name, args, err, b)
		}
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			want, _ := os.ReadFile(p)
			got, err := os.ReadFile(filepath.Join(out, rel))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s: %s not written by oras pull under its name: %v", name, rel, err)
			}
			return nil
		})
	}
}

func pushManifest(t *testing.T, s *layout.Store, subject *ocispec.Descriptor, payload []byte) ocispec.Descriptor {
	t.Helper()
	ctx := context.Background()
	cfg := ocispec.DescriptorEmptyJSON
	if err := s.Push(ctx, cfg, bytes.NewReader(cfg.Data)); err != nil {
		t.Fatal(err)
	}
	layer := ocispec.Descriptor{MediaType: "application/vnd.test.sig", Digest: digest.FromBytes(payload), Size: int64(len(payload))}
	if err := s.Push(ctx, layer, bytes.NewReader(payload)); err != nil {
		t.Fatal(err)
	}
	m := ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, ArtifactType: "application/vnd.test.sig", Config: cfg, Layers: []ocispec.Descriptor{layer}, Subject: subject}
	b, _ := json.Marshal(m)
	d := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(b), Size: int64(len(b))}
	if err := s.Push(ctx, d, bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	return d
}

func fetchManifest(t *testing.T, s content.Fetcher, d ocispec.Descriptor) ocispec.Manifest {
	t.Helper()
	b, err := content.FetchAll(context.Background(), s, d)
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if !artifact.IsModelManifest(m.ArtifactType, m.Config.MediaType) && m.ArtifactType != "application/vnd.test.sig" {
		t.Fatalf("not a model manifest: %s", b)
	}
	return m
}

// A layout written by oras names its entries with bare tags; the store reads and removes them as they are.
func TestForeignLayout(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "oras-layout")
	o, err := oci.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	blob := []byte("hello")
	layer := ocispec.Descriptor{MediaType: "text/plain", Digest: digest.FromBytes(blob), Size: int64(len(blob)), Annotations: map[string]string{ocispec.AnnotationTitle: "hello.txt"}}
	if err := o.Push(ctx, layer, bytes.NewReader(blob)); err != nil {
		t.Fatal(err)
	}
	desc, err := oras.PackManifest(ctx, o, oras.PackManifestVersion1_1, "application/vnd.test", oras.PackManifestOptions{Layers: []ocispec.Descriptor{layer}})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Tag(ctx, desc, "v1"); err != nil {
		t.Fatal(err)
	}
	s, err := layout.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, err := s.Resolve(ctx, "v1"); err != nil || got.Digest != desc.Digest {
		t.Fatalf("Resolve(v1) = %v, %v", got, err)
	}
	if err := s.Untag(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	if entries, _ := s.List(); len(entries) != 0 {
		t.Fatalf("entries after untag: %v", entries)
	}
}

// A blob of the CLI's store flipped in place with dd conv=notrunc between two commands (each opens the store
// afresh), its mtime put back: the next read re-hashes it (its stamp changed), refuses it and quarantines it,
// rather than handing the flipped bytes to unpack or push.
func TestFetchRefusesABlobChangedOnDisk(t *testing.T) {
	s := newStore(t)
	packSample(t, s, "flip:v1", 7)
	_, m, err := s.Manifest(context.Background(), "flip:v1")
	if err != nil {
		t.Fatal(err)
	}
	layer := m.Layers[0]
	root := s.Root()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	testenv.FlipByte(t, filepath.Join(root, "blobs", "sha256", layer.Digest.Encoded()), layer.Size/2, true)
	s2, err := layout.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	if rc, err := s2.Fetch(context.Background(), m.Config); err != nil {
		t.Fatalf("an untouched blob: %v", err)
	} else {
		rc.Close()
	}
	if _, err := s2.Fetch(context.Background(), layer); !errors.Is(err, cas.ErrDigestMismatch) || !strings.Contains(err.Error(), "pull the artifact again") {
		t.Fatalf("fetch of a flipped blob: %v, want a digest mismatch that says what to do", err)
	}
	if _, err := os.Stat(filepath.Join(root, "quarantine", "sha256-"+layer.Digest.Encoded())); err != nil {
		t.Errorf("not quarantined: %v", err)
	}
}
