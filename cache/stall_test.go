package cache

import (
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	mpremote "github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/internal/testenv"
)

// neverGiveUp are a stalled source's limits in these tests: an hour for headers and for each silence, so only a
// pull that stops waiting on a source nobody else needs can pass.
var neverGiveUp = mpremote.Timeouts{ResponseHeader: time.Hour, Idle: time.Hour, Attempts: 8}

// stallCase is one model served by a healthy real registry and by a StallServer in some mode.
type stallCase struct {
	healthy *testenv.Registry
	stalled *testenv.StallServer
	desc    ocispec.Descriptor
	weights digest.Digest
}

func newStallCase(t *testing.T, mode testenv.StallMode) *stallCase {
	reg := startRegistry(t)
	files := []modelFile{{Path: "model.safetensors", Data: shard(3, 512<<10)}, {Path: "config.json", Data: []byte(`{"a":1}`)}}
	desc := pushModel(t, newRepo(t, reg.Host, "m/model"), "v1", files)
	b, err := newRepo(t, reg.Host, "m/model").Fetch(context.Background(), desc)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var raw json.RawMessage
	if err := json.NewDecoder(b).Decode(&raw); err != nil {
		t.Fatal(err)
	}
	s := &stallCase{healthy: reg, stalled: testenv.StartStallServer(t, mode), desc: desc, weights: digest.FromBytes(files[0].Data)}
	s.stalled.Serve("v1", desc.MediaType, raw)
	return s
}

// stalledRepo reads the StallServer as the driver would, with limits that never run out during the test.
func (s *stallCase) stalledRepo(t *testing.T) *mpremote.Repository {
	t.Helper()
	r, _, err := mpremote.NewRepository(s.stalled.Host+"/m/model", mpremote.Options{PlainHTTP: true,
		RegistryConfig: filepath.Join(t.TempDir(), "config.json"), Timeouts: neverGiveUp})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// stalledOn is the request of the StallServer's mode that gets no answer.
func (s *stallCase) stalledOn() string {
	if s.stalled.Mode == testenv.StallAll {
		return "GET /v2/m/model/manifests/" + s.desc.Digest.String()
	}
	return "GET /v2/m/model/blobs/" // the config's, the first blob a pull reads
}

// waitRequest waits for the StallServer to read a request starting with want.
func waitRequest(t *testing.T, s *testenv.StallServer, want string) {
	t.Helper()
	for {
		select {
		case got := <-s.Requests():
			if strings.HasPrefix(got, want) {
				return
			}
		case <-time.After(time.Minute): // a failure guard, never the condition
			t.Fatalf("the stalled source never received %q", want)
		}
	}
}

// gatedSource holds the healthy source's read of one blob until the test opens the gate, so a pull from it is
// under way when another caller joins.
type gatedSource struct {
	*mpremote.Repository
	blob    digest.Digest
	arrived chan struct{}
	gate    chan struct{}
	once    sync.Once
}

func (g *gatedSource) wait(desc ocispec.Descriptor) {
	if desc.Digest == g.blob {
		g.once.Do(func() { close(g.arrived) })
		<-g.gate
	}
}

func (g *gatedSource) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	g.wait(desc)
	return g.Repository.Fetch(ctx, desc)
}

func (g *gatedSource) FetchRange(ctx context.Context, desc ocispec.Descriptor, offset int64) (io.ReadCloser, int64, error) {
	g.wait(desc)
	return g.Repository.FetchRange(ctx, desc, offset)
}

// A pull of a digest from a source that stalls (accepting the connection and never answering, or sending a blob's
// headers and then nothing) never holds a pull of the same digest from a healthy registry, in either order: the
// healthy caller's source is raced at once, the pull completes from it while the stalled source still has its
// connection open with nothing sent past the request, both callers get the content, and the stalled transfer is
// then abandoned (the client hangs up).
func TestStalledSourceNeverHoldsAHealthyOne(t *testing.T) {
	for _, mode := range []struct {
		name string
		mode testenv.StallMode
	}{{"never answers", testenv.StallAll}, {"blob never answered", testenv.StallBlobs}, {"blob headers then nothing", testenv.StallBlobBodies}} {
		t.Run(mode.name+"/stalled first", func(t *testing.T) {
			s := newStallCase(t, mode.mode)
			c := openCache(t, t.TempDir(), Options{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			first := make(chan error, 1)
			go func() {
				_, err := c.Pull(ctx, s.stalledRepo(t), s.desc, nil)
				first <- err
			}()
			waitRequest(t, s.stalled, s.stalledOn())
			healthy := make(chan error, 1)
			go func() {
				_, err := c.Pull(ctx, newRepo(t, s.healthy.Host, "m/model"), s.desc, nil)
				healthy <- err
			}()
			s.expectServed(t, c, healthy, first, s.stalledOn(), cancel)
		})
		t.Run(mode.name+"/healthy first", func(t *testing.T) {
			s := newStallCase(t, mode.mode)
			c := openCache(t, t.TempDir(), Options{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			g := &gatedSource{Repository: newRepo(t, s.healthy.Host, "m/model"), blob: s.weights,
				arrived: make(chan struct{}), gate: make(chan struct{})}
			healthy := make(chan error, 1)
			go func() {
				_, err := c.Pull(ctx, g, s.desc, nil)
				healthy <- err
			}()
			<-g.arrived
			second := make(chan error, 1)
			go func() {
				_, err := c.Pull(ctx, s.stalledRepo(t), s.desc, nil)
				second <- err
			}()
			// The joiner's source is raced at once against the read still waiting for its first byte.
			blob := "GET /v2/m/model/blobs/" + s.weights.String()
			waitRequest(t, s.stalled, blob)
			close(g.gate)
			s.expectServed(t, c, healthy, second, blob, cancel)
		})
	}
}

// expectServed checks that the healthy caller gets the content while the stalled source has been sent nothing past
// the request (and, its limits being an hour, cannot have been given up on for silence), that the stalled transfer
// is abandoned once the content arrived (the client hangs up rather than keep a connection it does not need), and
// that the other caller, whose own source cannot serve the content (it stalls, or has no such blob), is not handed
// it: its pull waits on its own source's answer and ends in an error when cancelOther cancels it.
func (s *stallCase) expectServed(t *testing.T, c *Cache, healthy, other <-chan error, stalledOn string, cancelOther func()) {
	t.Helper()
	select {
	case err := <-healthy:
		if err != nil {
			t.Fatalf("the pull from the healthy registry failed: %v", err)
		}
	case <-time.After(time.Minute): // a failure guard, never the condition
		t.Fatal("the pull from the healthy registry is held by the stalled source")
	}
	if n := s.stalled.ExtraBytes(); n != 0 {
		t.Fatalf("the stalled source received %d bytes past its request", n)
	}
	if err := c.blobs.Verify(s.weights); err != nil {
		t.Fatal(err)
	}
	// Other reads raced with the stalled source (a join races every read still waiting for its first byte) are
	// abandoned too, in any order.
	for abandoned := false; !abandoned; {
		select {
		case line := <-s.stalled.Hangups():
			abandoned = strings.HasPrefix(line, stalledOn)
		case <-time.After(time.Minute):
			t.Fatalf("the stalled request %q was never abandoned", stalledOn)
		}
	}
	cancelOther()
	select {
	case err := <-other:
		if err == nil {
			t.Fatal("the caller whose source serves nothing was handed the content")
		}
	case <-time.After(time.Minute):
		t.Fatal("the stalled caller's pull never ended once cancelled")
	}
}

// Two pulls of different manifests sharing a blob share its download (cas coalesces the ingest): a pull from a
// healthy registry whose blob is being fetched by another manifest's pull from a stalled source must not wait on
// that source. Here the stalled source serves its manifest and config and stalls the shared weights; the healthy
// manifest differs by an annotation.
func TestStalledSourceOfAnotherManifestNeverHoldsASharedBlob(t *testing.T) {
	for _, mode := range []testenv.StallMode{testenv.StallBlobs, testenv.StallBlobBodies} {
		reg := startRegistry(t)
		weights := shard(5, 512<<10)
		files := []modelFile{{Path: "model.safetensors", Data: weights}}
		healthyRepo := newRepo(t, reg.Host, "m/model")
		mb := modelManifest(t, healthyRepo, files)
		var m ocispec.Manifest
		if err := json.Unmarshal(mb, &m); err != nil {
			t.Fatal(err)
		}
		m.Annotations = map[string]string{"org.example.copy": "2"}
		mb2, _ := json.Marshal(m)
		healthyDesc := pushManifest(t, healthyRepo, "v2", ocispec.MediaTypeImageManifest, mb2)
		stalled := testenv.StartStallServer(t, mode)
		stalledDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: stalled.Serve("v1", ocispec.MediaTypeImageManifest, mb), Size: int64(len(mb))}
		cfg, err := healthyRepo.Fetch(context.Background(), m.Config)
		if err != nil {
			t.Fatal(err)
		}
		cb, _ := io.ReadAll(cfg)
		cfg.Close()
		stalled.Give(cb)
		s := &stallCase{stalled: stalled, desc: stalledDesc, weights: digest.FromBytes(weights)}

		c := openCache(t, t.TempDir(), Options{})
		ctx, cancel := context.WithCancel(context.Background())
		first := make(chan error, 1)
		go func() {
			_, err := c.Pull(ctx, s.stalledRepo(t), stalledDesc, nil)
			first <- err
		}()
		waitRequest(t, stalled, "GET /v2/m/model/blobs/"+s.weights.String())
		healthy := make(chan error, 1)
		go func() {
			_, err := c.Pull(ctx, healthyRepo, healthyDesc, nil)
			healthy <- err
		}()
		s.expectServed(t, c, healthy, first, "GET /v2/m/model/blobs/"+s.weights.String(), cancel)
		cancel()
	}
}

// Two healthy registries: a caller of the second joining a pull from the first while its weights stream takes
// nothing from the second. Every blob crosses the network once; racing is for sources that are silent.
func TestHealthyJoinerDownloadsNothingTwice(t *testing.T) {
	reg := startRegistry(t)
	files := []modelFile{{Path: "model.safetensors", Data: shard(9, 1<<20)}, {Path: "config.json", Data: []byte(`{"b":2}`)}}
	desc := pushModel(t, newRepo(t, reg.Host, "m/model"), "v1", files)
	a, b := newProxy(t, reg.Host), newProxy(t, reg.Host)
	a.rate.Store(512 << 10) // about 2 s for the weights: under way when the second caller joins
	c := openCache(t, t.TempDir(), Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first := make(chan error, 1)
	streaming := make(chan struct{})
	var once sync.Once
	go func() {
		_, err := c.Pull(ctx, newRepo(t, a.Host, "m/model"), desc, func(p Progress) {
			if p.Done >= 128<<10 { // the weights have reached the cache: their read delivers
				once.Do(func() { close(streaming) })
			}
		})
		first <- err
	}()
	select {
	case <-streaming:
	case err := <-first:
		t.Fatalf("the first pull ended before its weights streamed: %v", err)
	}
	if _, err := c.Pull(ctx, newRepo(t, b.Host, "m/model"), desc, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	var want int64
	for _, f := range files {
		want += int64(len(f.Data))
	}
	if got := a.blobBytes() + b.blobBytes(); got != want+configSize(t, c, desc) {
		t.Fatalf("%d blob bytes crossed the network (%d from the first source, %d from the second), want %d",
			got, a.blobBytes(), b.blobBytes(), want+configSize(t, c, desc))
	}
}

// configSize is the size of desc's config, read from the cache.
func configSize(t *testing.T, c *Cache, desc ocispec.Descriptor) int64 {
	t.Helper()
	rc, err := c.blobs.Open(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var m ocispec.Manifest
	if err := json.NewDecoder(rc).Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m.Config.Size
}
