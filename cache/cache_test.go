package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/artifact"
)

func sampleModel(t testing.TB, seed byte) []modelFile {
	code := makeTar(t, true,
		tarEntry{Name: "src/", Type: '5', Mode: 0o755},
		tarEntry{Name: "src/a.py", Body: "print('a')\n", Mode: 0o600},
		tarEntry{Name: "src/sub/b.py", Body: "print('b')\n", Mode: 0o755},
	)
	return []modelFile{
		{Path: "model-00001-of-00002.safetensors", Data: shard(seed, 64<<10)},
		{Path: "model-00002-of-00002.safetensors", Data: shard(seed+1, 48<<10)},
		{Path: "config.json", Data: []byte(`{"model_type":"llama"}`)},
		{Path: "README.md", Data: []byte("# model\n")},
		{Path: "src", Data: code, Kind: artifact.KindCode, Format: artifact.FormatTarGzip},
	}
}

func TestPullAndViews(t *testing.T) {
	src := newMemTarget()
	desc := src.manifestDesc(modelManifest(t, src, sampleModel(t, 1)))
	c := openCache(t, t.TempDir(), Options{})
	ctx := context.Background()

	var last Progress
	got, err := c.Pull(ctx, src, desc, func(p Progress) { last = p })
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != desc.Digest || got.ArtifactType != artifact.ArtifactTypeModelManifest {
		t.Errorf("Pull returned %+v", got)
	}
	if last.Total == 0 || last.Done != last.Total {
		t.Errorf("final progress %+v", last)
	}
	if !c.Has(desc.Digest) || c.Has(digest.FromString("other")) {
		t.Error("Has is wrong")
	}

	dir, err := c.Acquire("vol-1", desc.Digest, Selector{})
	if err != nil {
		t.Fatal(err)
	}
	sh := shard(1, 64<<10)
	want := []string{
		"README.md file 444 " + digest.FromString("# model\n").Encoded()[:12],
		"config.json file 444 " + digest.FromString(`{"model_type":"llama"}`).Encoded()[:12],
		"model-00001-of-00002.safetensors file 444 " + digest.FromBytes(sh).Encoded()[:12],
		"model-00002-of-00002.safetensors file 444 " + digest.FromBytes(shard(2, 48<<10)).Encoded()[:12],
		"src dir 555",
		"src/a.py file 444 " + digest.FromString("print('a')\n").Encoded()[:12],
		"src/sub dir 555",
		"src/sub/b.py file 555 " + digest.FromString("print('b')\n").Encoded()[:12],
	}
	if tree := listTree(t, dir); !slices.Equal(tree, want) {
		t.Errorf("view:\n%s\nwant:\n%s", strings.Join(tree, "\n"), strings.Join(want, "\n"))
	}
	// A raw layer is the blob itself, not a copy.
	a, _ := os.Stat(filepath.Join(dir, "model-00001-of-00002.safetensors"))
	b, _ := os.Stat(c.Blobs().Path(digest.FromBytes(sh)))
	if !os.SameFile(a, b) {
		t.Error("raw layer was copied into the view")
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o555 {
		t.Errorf("view root mode %v", fi.Mode())
	}

	// A second volume shares the view; a pulled-again manifest costs nothing.
	dir2, err := c.Acquire("vol-2", desc.Digest, Selector{})
	if err != nil || dir2 != dir {
		t.Fatalf("second acquire: %s, %v", dir2, err)
	}
	src.gets = map[digest.Digest]int{}
	if _, err := c.Pull(ctx, src, desc, nil); err != nil || len(src.gets) != 0 {
		t.Errorf("second pull fetched %v (%v)", src.gets, err)
	}

	// Selectors give partial views.
	weights, err := c.Acquire("vol-3", desc.Digest, Selector{Kinds: []artifact.Kind{artifact.KindWeight}})
	if err != nil {
		t.Fatal(err)
	}
	if tree := listTree(t, weights); len(tree) != 2 || !strings.HasPrefix(tree[0], "model-00001") {
		t.Errorf("weights view: %v", tree)
	}
	srcOnly, err := c.Acquire("vol-4", desc.Digest, Selector{Include: []string{"src/sub/**", "*.md"}})
	if err != nil {
		t.Fatal(err)
	}
	if tree := listTree(t, srcOnly); len(tree) != 4 || !strings.HasPrefix(tree[0], "README.md") || !strings.HasPrefix(tree[3], "src/sub/b.py") {
		t.Errorf("include view: %v", tree)
	}
	if _, err := c.Acquire("vol-5", desc.Digest, Selector{Include: []string{"[x"}}); err == nil {
		t.Error("bad glob accepted")
	}

	refs, err := c.Refs()
	if err != nil || len(refs) != 4 {
		t.Fatalf("refs %v %v", refs, err)
	}
	list, err := c.List()
	if err != nil || len(list) != 1 || len(list[0].Refs) != 4 || len(list[0].Views) != 3 || !list[0].Complete {
		t.Fatalf("list %+v %v", list, err)
	}
	if err := c.Remove(desc.Digest); !errors.Is(err, ErrInUse) {
		t.Errorf("Remove of a referenced manifest: %v", err)
	}
	for _, o := range []string{"vol-1", "vol-2", "vol-3", "vol-4", "vol-4", "unknown"} {
		if err := c.Release(o); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := c.Verify(ctx)
	if err != nil || len(rep.Problems) != 0 || rep.Blobs != 7 {
		t.Errorf("verify %+v %v", rep, err)
	}
	// Unreferenced selector views go at the next GC; the whole view stays for the next volume.
	if st, err := c.GC(ctx); err != nil || st.Views != 2 || len(st.Evicted) != 0 || st.Blobs != 0 {
		t.Errorf("gc %+v %v", st, err)
	}
	u, err := c.Usage()
	if err != nil || u.Referenced != 0 || u.BlobCount != 7 || u.LayerCount != 1 || u.Views != 1 {
		t.Errorf("usage %+v %v", u, err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("whole view removed: %v", err)
	}
	if err := c.Remove(desc.Digest); err != nil {
		t.Fatal(err)
	}
	u, _ = c.Usage()
	if c.Has(desc.Digest) || u.Bytes != 0 || u.Views != 0 || u.Manifests != 0 {
		t.Errorf("after Remove: %+v", u)
	}
	if left, _ := filepath.Glob(filepath.Join(c.Root(), "ingest", "*.*")); len(left) != 0 {
		t.Errorf("ingest/ keeps stale locks or partials: %v", left)
	}
	if _, err := c.Acquire("vol-1", desc.Digest, Selector{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("acquire after remove: %v", err)
	}
}

// TestSharedShards: two models sharing 3 of 4 shards store them once, and the second pull moves only the changed
// shard (bytes counted by a proxy in front of a real registry).
func TestSharedShards(t *testing.T) {
	reg := startRegistry(t)
	px := newProxy(t, reg.Host)
	const size = 1 << 20
	var a, b []modelFile
	for i := range 4 {
		name := fmt.Sprintf("model-%05d-of-00004.safetensors", i+1)
		a = append(a, modelFile{Path: name, Data: shard(byte(10+i), size)})
		data := shard(byte(10+i), size)
		if i == 3 {
			data = shard(99, size)
		}
		b = append(b, modelFile{Path: name, Data: data})
	}
	push := newRepo(t, reg.Host, "models/shared")
	descA := pushModel(t, push, "v1", a)
	descB := pushModel(t, push, "v2", b)

	c := openCache(t, t.TempDir(), Options{})
	repo := newRepo(t, px.Host, "models/shared")
	if _, err := c.Pull(context.Background(), repo, descA, nil); err != nil {
		t.Fatal(err)
	}
	if got := px.blobBytes(); got < 4*size {
		t.Fatalf("first pull moved %d bytes", got)
	}
	px.reset()
	if _, err := c.Pull(context.Background(), repo, descB, nil); err != nil {
		t.Fatal(err)
	}
	changed := int64(size)
	got := px.blobBytes()
	t.Logf("second pull: %d blob bytes for %d changed bytes (%.4fx)", got, changed, float64(got)/float64(changed))
	if float64(got) > 1.01*float64(changed) {
		t.Errorf("second pull moved %d bytes, want ≤ 1.01 × %d", got, changed)
	}
	u, _ := c.Usage()
	// 5 distinct shards, 2 manifests, 2 configs.
	if u.BlobCount != 9 {
		t.Errorf("blobs stored: %d, want 9", u.BlobCount)
	}
	da, _ := c.Acquire("a", descA.Digest, Selector{})
	db, _ := c.Acquire("b", descB.Digest, Selector{})
	fa, _ := os.Stat(filepath.Join(da, "model-00001-of-00004.safetensors"))
	fb, _ := os.Stat(filepath.Join(db, "model-00001-of-00004.safetensors"))
	if !os.SameFile(fa, fb) {
		t.Error("shared shard stored twice")
	}
}

// TestConcurrentPulls: 50 concurrent Pull+Acquire of one reference fetch every blob exactly once.
func TestConcurrentPulls(t *testing.T) {
	reg := startRegistry(t)
	px := newProxy(t, reg.Host)
	desc := pushModel(t, newRepo(t, reg.Host, "models/c"), "v1", sampleModel(t, 3))
	c := openCache(t, t.TempDir(), Options{})
	repo := newRepo(t, px.Host, "models/c")
	px.reset()
	var wg sync.WaitGroup
	dirs := make([]string, 50)
	errs := make([]error, 50)
	for i := range 50 {
		wg.Go(func() {
			d, err := c.Pull(context.Background(), repo, desc, nil)
			if err == nil {
				dirs[i], err = c.Acquire(fmt.Sprintf("vol-%d", i), d.Digest, Selector{})
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pull %d: %v", i, err)
		}
		if dirs[i] != dirs[0] {
			t.Fatalf("views differ: %s %s", dirs[i], dirs[0])
		}
	}
	gets := px.getCounts()
	blobs := 0
	for path, n := range gets {
		if n != 1 {
			t.Errorf("GET %s %d times", path, n)
		}
		if strings.Contains(path, "/blobs/") {
			blobs++
		}
	}
	// config + 5 layers
	if blobs != 6 {
		t.Errorf("%d blobs fetched, want 6: %v", blobs, gets)
	}
}

// TestPullLinger: a Pull whose caller gives up keeps going, and the retry joins it instead of starting over
// (the CSI deadline pattern).
func TestPullLinger(t *testing.T) {
	reg := startRegistry(t)
	px := newProxy(t, reg.Host)
	files := []modelFile{{Path: "w.safetensors", Data: shard(5, 2<<20)}}
	desc := pushModel(t, newRepo(t, reg.Host, "models/l"), "v1", files)
	c := openCache(t, t.TempDir(), Options{})
	repo := newRepo(t, px.Host, "models/l")
	px.rate.Store(4 << 20) // ~0.5 s for the shard
	px.reset()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.Pull(ctx, repo, desc, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first pull: %v", err)
	}
	if c.Has(desc.Digest) {
		t.Fatal("complete already")
	}
	if _, err := c.Pull(context.Background(), repo, desc, nil); err != nil {
		t.Fatal(err)
	}
	for path, n := range px.getCounts() {
		if strings.Contains(path, "/blobs/") && n != 1 {
			t.Errorf("GET %s %d times: the retry did not join", path, n)
		}
	}

	// Without linger the abandoned pull stops at once; the retry starts a new one that resumes the partial blob.
	c2 := openCache(t, t.TempDir(), Options{PullLinger: -1})
	px.reset()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if _, err := c2.Pull(ctx2, repo, desc, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first pull: %v", err)
	}
	if _, err := c2.Pull(context.Background(), repo, desc, nil); err != nil {
		t.Fatal(err)
	}
	if got, max := px.blobBytes(), int64(2<<20)+512<<10; got > max {
		t.Errorf("abandoned then retried pull moved %d bytes, want at most %d (resumed)", got, max)
	}
}

// A partial blob resumes with a Range request for exactly the missing bytes, through the repository the driver
// reads with (artifact/remote): the kept bytes are not sent again.
func TestPartialBlobResumesWithRange(t *testing.T) {
	reg := startRegistry(t)
	px := newProxy(t, reg.Host)
	data := shard(8, 2<<20)
	desc := pushModel(t, newRepo(t, reg.Host, "models/resume"), "v1", []modelFile{{Path: "w.safetensors", Data: data}})
	root := t.TempDir()
	wd := digest.FromBytes(data)
	kept := 3 << 19
	if err := os.MkdirAll(filepath.Join(root, "ingest"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "ingest", "sha256-"+wd.Encoded()+".partial"), data[:kept], 0o644); err != nil {
		t.Fatal(err)
	}
	c := openCache(t, root, Options{})
	px.reset()
	if _, err := c.Pull(context.Background(), newRepo(t, px.Host, "models/resume"), desc, nil); err != nil {
		t.Fatal(err)
	}
	path := "/v2/models/resume/blobs/" + wd.String()
	px.mu.Lock()
	ranges, sent, gets := px.ranges[path], px.bytes[path], px.gets[path]
	px.mu.Unlock()
	if want := fmt.Sprintf("bytes=%d-", kept); gets != 1 || len(ranges) != 1 || ranges[0] != want {
		t.Fatalf("resumed shard: %d GETs with Range %q, want one with %q", gets, ranges, want)
	}
	if want := int64(len(data) - kept); sent != want {
		t.Fatalf("resumed shard: the registry sent %d bytes, want the %d missing", sent, want)
	}
	dir, err := c.Acquire("vol", desc.Digest, Selector{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "w.safetensors")); !bytes.Equal(got, data) {
		t.Fatal("resumed shard has the wrong bytes")
	}
}

// TestGCRacingAcquires: GC running flat out with a tiny cap while volumes pull, acquire, read and release never
// removes content a volume holds.
func TestGCRacingAcquires(t *testing.T) {
	src := newMemTarget()
	var models []ocispec.Descriptor
	var trees, weightTrees [][]string
	weights := Selector{Kinds: []artifact.Kind{artifact.KindWeight}}
	ref := t.TempDir()
	for i := range 4 {
		files := sampleModel(t, byte(20+i*3))
		models = append(models, src.manifestDesc(modelManifest(t, src, files)))
		_ = i
	}
	// Reference trees from a cache GC never touches.
	rc := openCache(t, ref, Options{})
	for i, m := range models {
		if _, err := rc.Pull(context.Background(), src, m, nil); err != nil {
			t.Fatal(err)
		}
		d, err := rc.Acquire("ref", m.Digest, Selector{})
		if err != nil {
			t.Fatal(err)
		}
		trees = append(trees, listTree(t, d))
		d, err = rc.Acquire("ref-w", m.Digest, weights)
		if err != nil {
			t.Fatal(err)
		}
		weightTrees = append(weightTrees, listTree(t, d))
		_ = i
	}

	c := openCache(t, t.TempDir(), Options{MaxBytes: 1, MinAge: -1})
	ctx := context.Background()
	// A pin holds model 0 throughout.
	if _, err := c.Pull(ctx, src, models[0], nil); err != nil {
		t.Fatal(err)
	}
	pinned, err := c.Acquire("pin:zero", models[0].Digest, Selector{})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var gcWG, wg sync.WaitGroup
	var evictions int
	gcWG.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, err := c.GC(ctx)
			if err != nil {
				t.Errorf("gc: %v", err)
				return
			}
			evictions += len(st.Evicted)
		}
	})
	for w := range 4 {
		wg.Go(func() {
			owner := fmt.Sprintf("vol-%d", w)
			for i := range 15 {
				m := (w + i) % len(models)
				// Odd workers use a selector view, which GC deletes as soon as it is unreferenced.
				sel, want := Selector{}, trees[m]
				if w%2 == 1 {
					sel, want = weights, weightTrees[m]
				}
				var dir string
				for {
					if _, err := c.Pull(ctx, src, models[m], nil); err != nil {
						t.Errorf("pull: %v", err)
						return
					}
					d, err := c.Acquire(owner, models[m].Digest, sel)
					if errors.Is(err, ErrNotFound) {
						continue // evicted between Pull and Acquire (MinAge is off): pull again
					}
					if err != nil {
						t.Errorf("acquire: %v", err)
						return
					}
					dir = d
					break
				}
				time.Sleep(time.Millisecond)
				if tree := listTree(t, dir); !slices.Equal(tree, want) {
					t.Errorf("view of model %d changed under its volume:\n%v\nwant\n%v", m, tree, want)
					return
				}
				if err := c.Release(owner); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	gcWG.Wait()
	if evictions == 0 {
		t.Error("GC never evicted anything: the race was not exercised")
	}
	if tree := listTree(t, pinned); !slices.Equal(tree, trees[0]) {
		t.Error("pinned view damaged")
	}
	st, err := c.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	list, _ := c.List()
	if len(list) != 1 || list[0].Descriptor.Digest != models[0].Digest {
		t.Errorf("after final GC: %+v (stats %+v)", list, st)
	}
	if rep, err := c.Verify(ctx); err != nil || len(rep.Problems) != 0 {
		t.Errorf("verify: %+v %v", rep, err)
	}
	t.Logf("%d evictions during the race", evictions)
}

func TestGCLeastRecentlyUsed(t *testing.T) {
	src := newMemTarget()
	var models []ocispec.Descriptor
	for i := range 3 {
		models = append(models, src.manifestDesc(modelManifest(t, src, []modelFile{{Path: "w.safetensors", Data: shard(byte(40+i), 100<<10)}})))
	}
	ctx := context.Background()
	c := openCache(t, t.TempDir(), Options{MaxBytes: 250 << 10, MinAge: -1})
	for _, m := range models {
		if _, err := c.Pull(ctx, src, m, nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Use model 0 again: model 1 becomes the least recently used.
	if _, err := c.Acquire("v", models[0].Digest, Selector{}); err != nil {
		t.Fatal(err)
	}
	c.Release("v")
	st, err := c.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Evicted) != 1 || st.Evicted[0] != models[1].Digest || st.After > 250<<10 || st.Blobs != 3 {
		t.Errorf("gc %+v", st)
	}
	if !c.Has(models[0].Digest) || c.Has(models[1].Digest) || !c.Has(models[2].Digest) {
		t.Error("wrong manifest evicted")
	}

	// Shared blobs free nothing until their last manifest goes: evicting A (sharing its big shard with B) is
	// not enough, evicting B too is, and C (most recent) stays.
	shared := shard(50, 100<<10)
	a := src.manifestDesc(modelManifest(t, src, []modelFile{{Path: "s.safetensors", Data: shared}, {Path: "a.safetensors", Data: shard(51, 10<<10)}}))
	bm := src.manifestDesc(modelManifest(t, src, []modelFile{{Path: "s.safetensors", Data: shared}, {Path: "b.safetensors", Data: shard(52, 10<<10)}}))
	cm := src.manifestDesc(modelManifest(t, src, []modelFile{{Path: "c.safetensors", Data: shard(53, 100<<10)}}))
	c3 := openCache(t, t.TempDir(), Options{MaxBytes: 130 << 10, MinAge: -1})
	for _, m := range []ocispec.Descriptor{a, bm, cm} {
		if _, err := c3.Pull(ctx, src, m, nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	st, err = c3.GC(ctx)
	if err != nil || len(st.Evicted) != 2 || !c3.Has(cm.Digest) || st.After > 130<<10 {
		t.Errorf("shared eviction: %+v %v", st, err)
	}

	// MinAge protects fresh content however full the cache is.
	c2 := openCache(t, t.TempDir(), Options{MaxBytes: 1})
	if _, err := c2.Pull(ctx, src, models[0], nil); err != nil {
		t.Fatal(err)
	}
	if st, err := c2.GC(ctx); err != nil || len(st.Evicted) != 0 {
		t.Errorf("fresh content evicted: %+v %v", st, err)
	}
}

// TestRecovery: leftovers of a crash are cleaned at Open, a partial download is kept and resumed.
func TestRecovery(t *testing.T) {
	src := newMemTarget()
	data := shard(7, 1<<20)
	desc := src.manifestDesc(modelManifest(t, src, []modelFile{{Path: "w.safetensors", Data: data}}))
	root := t.TempDir()
	c := openCache(t, root, Options{})
	c.Close()
	// A half-built view, a half-extracted layer, something half-deleted, and half of the shard.
	for _, d := range []string{"tmp/view-abc-1/sub", "tmp/layer-abc-2", "trash/x-1/y"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.Chmod(filepath.Join(root, "tmp/view-abc-1"), 0o555)
	wd := digest.FromBytes(data)
	partial := filepath.Join(root, "ingest", "sha256-"+wd.Encoded()+".partial")
	os.WriteFile(partial, data[:1<<19], 0o644)

	c = openCache(t, root, Options{})
	for _, d := range []string{"tmp", "trash"} {
		if entries, _ := os.ReadDir(filepath.Join(root, d)); len(entries) != 0 {
			t.Errorf("%s not cleaned: %v", d, entries)
		}
	}
	if u, _ := c.Usage(); u.Partials != 1<<19 {
		t.Errorf("partial not kept: %+v", u)
	}
	seek := &seekTarget{memTarget: src}
	if _, err := c.Pull(context.Background(), seek, desc, nil); err != nil {
		t.Fatal(err)
	}
	if seek.read[wd] != int64(len(data))-1<<19 {
		t.Errorf("resumed pull read %d bytes of the shard, want %d", seek.read[wd], len(data)-1<<19)
	}
	if rep, err := c.Verify(context.Background()); err != nil || len(rep.Problems) != 0 {
		t.Errorf("verify %+v %v", rep, err)
	}
}

// seekTarget serves seekable readers (as oras-go does for registries that accept Range) and counts bytes read.
type seekTarget struct {
	*memTarget
	mu   sync.Mutex
	read map[digest.Digest]int64
}

type seekReader struct {
	*strings.Reader
	t *seekTarget
	d digest.Digest
}

func (r *seekReader) Read(p []byte) (int, error) {
	n, err := r.Reader.Read(p)
	r.t.mu.Lock()
	if r.t.read == nil {
		r.t.read = map[digest.Digest]int64{}
	}
	r.t.read[r.d] += int64(n)
	r.t.mu.Unlock()
	return n, err
}

func (r *seekReader) Close() error { return nil }

func (s *seekTarget) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	s.memTarget.mu.Lock()
	b, ok := s.memTarget.blobs[d.Digest]
	s.memTarget.mu.Unlock()
	if !ok {
		return nil, ErrNotFound
	}
	return &seekReader{Reader: strings.NewReader(string(b)), t: s, d: d.Digest}, nil
}

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(crashHelper())
	}
	if os.Getenv(holdHelperEnv) != "" {
		os.Exit(holdHelper())
	}
	os.Exit(m.Run())
}
