package cache

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	mpremote "github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/internal/testenv"
)

// twoSources serves one model from two registries: bad, whose blob GETs a test hooks, and a healthy one.
type twoSources struct {
	bad, healthy *testenv.HostileRegistry
	desc         ocispec.Descriptor
	weights      digest.Digest
	config       digest.Digest
	manifest     []byte
}

func newTwoSources(t *testing.T) *twoSources {
	files := []modelFile{{Path: "model.safetensors", Data: shard(7, 256<<10)}}
	s := &twoSources{bad: testenv.StartHostileRegistry(t), healthy: testenv.StartHostileRegistry(t),
		weights: digest.FromBytes(files[0].Data)}
	mb := modelManifest(t, s.bad, files)
	var m ocispec.Manifest
	if err := json.Unmarshal(mb, &m); err != nil {
		t.Fatal(err)
	}
	s.config, s.manifest = m.Config.Digest, mb
	modelManifest(t, s.healthy, files)
	s.desc = s.bad.Manifest(t, "v1", json.RawMessage(mb), ocispec.MediaTypeImageManifest)
	s.healthy.Manifest(t, "v1", json.RawMessage(mb), ocispec.MediaTypeImageManifest)
	return s
}

func (s *twoSources) repo(t *testing.T, h *testenv.HostileRegistry) *mpremote.Repository {
	t.Helper()
	fast := mpremote.Timeouts{ResponseHeader: 200 * time.Millisecond, Idle: 200 * time.Millisecond, Attempts: 2}
	r, _, err := mpremote.NewRepository(h.Host+"/m/model:v1", mpremote.Options{PlainHTTP: true,
		RegistryConfig: filepath.Join(t.TempDir(), "config.json"), Timeouts: fast})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// joinedPull starts a pull from the bad registry and, once its weights GET arrived, joins it from the healthy one.
// Both callers must get the content, verified, with the healthy registry asked for the weights.
func (s *twoSources) joinedPull(t *testing.T, c *Cache, arrived <-chan struct{}, joined func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first := make(chan error, 1)
	go func() {
		_, err := c.Pull(ctx, s.repo(t, s.bad), s.desc, nil)
		first <- err
	}()
	<-arrived
	second := make(chan error, 1)
	go func() {
		got, err := c.Pull(ctx, s.repo(t, s.healthy), s.desc, nil)
		if err == nil && got.Digest != s.desc.Digest {
			t.Errorf("pulled %s, want %s", got.Digest, s.desc.Digest)
		}
		second <- err
	}()
	if joined != nil {
		waitForSources(t, c, s.desc.Digest, 2)
		joined()
	}
	if err := <-second; err != nil {
		t.Fatalf("pull from the healthy registry, joined to the bad one: %v", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("the first caller failed although the content arrived: %v", err)
	}
	if s.healthy.Gets(s.weights) == 0 {
		t.Fatal("the healthy registry was never asked for the blob")
	}
	if err := c.blobs.Verify(s.weights); err != nil {
		t.Fatal(err)
	}
}

// waitForSources waits until the pull of d has n sources: a condition, not a guess at how long a join takes.
func waitForSources(t *testing.T, c *Cache, d digest.Digest, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		c.mu.Lock()
		f := c.flights[flightKey{digest: d}]
		c.mu.Unlock()
		if f != nil {
			f.src.mu.Lock()
			have := len(f.src.list)
			f.src.mu.Unlock()
			if have >= n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pull of %s never had %d sources", d, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A pull from a registry that accepts the blob GET and never answers must not hold a pull of the same digest from
// a healthy registry that joins it: the healthy source takes over, and both callers get the content.
func TestStallingSourceHandsTheJoinedPullToAHealthyOne(t *testing.T) {
	s := newTwoSources(t)
	arrived := make(chan struct{})
	var once sync.Once
	s.bad.OnBlob = func(w http.ResponseWriter, r *http.Request, d digest.Digest, _ []byte) bool {
		if d != s.weights {
			return false
		}
		once.Do(func() { close(arrived) })
		<-r.Context().Done() // accepts the GET and never answers
		return true
	}
	s.joinedPull(t, openCache(t, t.TempDir(), Options{}), arrived, nil)
}

// A source that sends wrong bytes (another digest, too many, too few; for a layer or the config) hands the joined
// pull to a healthy source as a stalling one does, and is not asked again; the pull neither fails nor keeps the
// wrong bytes.
func TestWrongBytesHandTheJoinedPullToAHealthyOne(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config bool // lie about the config instead of the weights
		body   func(good []byte) (b []byte, declareLength bool)
	}{
		{"same size, other digest", false, func(good []byte) ([]byte, bool) {
			b := append([]byte(nil), good...)
			b[len(b)/2] ^= 0xff
			return b, true
		}},
		{"longer than the descriptor", false, func(good []byte) ([]byte, bool) {
			b := append(append([]byte(nil), good...), "trailer"...)
			b[1] ^= 0xff
			return b, false
		}},
		{"shorter than the descriptor, a clean end", false, func(good []byte) ([]byte, bool) {
			b := append([]byte(nil), good[:len(good)/2]...)
			b[0] ^= 0xff
			return b, false
		}},
		{"config, same size, other digest", true, func(good []byte) ([]byte, bool) {
			b := append([]byte(nil), good...)
			b[len(b)-1] ^= 0x01
			return b, true
		}},
		{"config, longer than the descriptor", true, func(good []byte) ([]byte, bool) {
			return append(append([]byte(nil), good...), ' '), false
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTwoSources(t)
			arrived, release := make(chan struct{}), make(chan struct{})
			var mu sync.Mutex
			lies := 0
			s.bad.OnBlob = func(w http.ResponseWriter, r *http.Request, d digest.Digest, good []byte) bool {
				if (d != s.weights && !tc.config) || (d != s.config && tc.config) {
					return false
				}
				mu.Lock()
				lies++
				if lies == 1 {
					close(arrived)
				}
				mu.Unlock()
				select { // lie once the healthy caller has joined
				case <-release:
				case <-r.Context().Done():
					return true
				}
				b, declare := tc.body(good)
				if declare {
					w.Header().Set("Content-Length", strconv.Itoa(len(b)))
				}
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush() // no Content-Length unless declared: a chunked body
				w.Write(b)
				return true
			}
			c := openCache(t, t.TempDir(), Options{})
			s.joinedPull(t, c, arrived, func() { close(release) })
			mu.Lock()
			defer mu.Unlock()
			if lies != 1 {
				t.Fatalf("the source that sent wrong bytes was asked %d times, want once", lies)
			}
		})
	}
}

// A pull every source failed answers each caller with its own source's failure: the caller of a registry that
// refuses (403) is not told another registry's "not found", nor the other way round.
func TestEachCallerGetsItsOwnSourcesError(t *testing.T) {
	s := newTwoSources(t)
	arrived, release := make(chan struct{}), make(chan struct{})
	var once, once2 sync.Once
	s.bad.OnBlob = func(w http.ResponseWriter, r *http.Request, d digest.Digest, _ []byte) bool {
		if d != s.weights {
			return false
		}
		once.Do(func() { close(arrived) })
		select { // fail once the other caller's source has failed
		case <-release:
		case <-r.Context().Done():
			return true
		}
		w.WriteHeader(http.StatusNotFound)
		return true
	}
	s.healthy.OnBlob = func(w http.ResponseWriter, r *http.Request, d digest.Digest, _ []byte) bool {
		if d != s.weights {
			return false
		}
		w.WriteHeader(http.StatusForbidden)
		once2.Do(func() { close(release) })
		return true
	}
	c := openCache(t, t.TempDir(), Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first := make(chan error, 1)
	go func() {
		_, err := c.Pull(ctx, s.repo(t, s.bad), s.desc, nil)
		first <- err
	}()
	<-arrived
	_, err := c.Pull(ctx, s.repo(t, s.healthy), s.desc, nil)
	if got := mpremote.Classify(err); got != mpremote.ErrForbidden {
		t.Fatalf("the refused caller got %v (%v), want its own registry's refusal", err, got)
	}
	if err := <-first; mpremote.Classify(err) != mpremote.ErrNotFound {
		t.Fatalf("the other caller got %v, want its own registry's not found", err)
	}
}

// A caller that joins a pull under way, or finds the content complete, gets nothing its own source does not serve:
// a registry that answers the manifest and 404 for every blob (an attacker who knows another tenant's digests) is
// refused with ErrNotFound while the pull it joined succeeds for its starter, and again once the content is
// complete; a source that serves the blobs is given the content with no blob fetched.
func TestNoCallerGetsBlobsItsSourceDoesNotServe(t *testing.T) {
	s := newTwoSources(t)
	evil := testenv.StartHostileRegistry(t)
	evilDesc := evil.Raw("v1", ocispec.MediaTypeImageManifest, s.manifest)
	if evilDesc.Digest != s.desc.Digest {
		t.Fatalf("the copied manifest is %s, want %s", evilDesc.Digest, s.desc.Digest)
	}
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.bad.OnBlob = func(w http.ResponseWriter, r *http.Request, d digest.Digest, _ []byte) bool {
		if d == s.weights {
			once.Do(func() { close(arrived) })
			<-release
		}
		return false
	}
	c := openCache(t, t.TempDir(), Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first := make(chan error, 1)
	go func() {
		_, err := c.Pull(ctx, s.repo(t, s.bad), s.desc, nil)
		first <- err
	}()
	<-arrived
	second := make(chan error, 1)
	go func() {
		_, err := c.Pull(ctx, s.repo(t, evil), s.desc, nil)
		second <- err
	}()
	waitForSources(t, c, s.desc.Digest, 2)
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("the starter's pull: %v", err)
	}
	if err := <-second; !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "does not serve") {
		t.Fatalf("a caller whose source serves no blob joined the pull and got %v, want ErrNotFound", err)
	}
	if _, err := c.Pull(ctx, s.repo(t, evil), s.desc, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the content complete, a caller whose source serves no blob got %v, want ErrNotFound", err)
	}
	if err := c.Prove(ctx, s.repo(t, evil), s.desc.Digest, s.desc.Digest); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Prove for a source that serves no blob: %v, want ErrNotFound", err)
	}
	gets := s.healthy.Gets(s.weights)
	if _, err := c.Pull(ctx, s.repo(t, s.healthy), s.desc, nil); err != nil {
		t.Fatalf("a source that serves every blob: %v", err)
	}
	if n := s.healthy.Gets(s.weights) - gets; n != 0 {
		t.Fatalf("the content complete, a source that serves it was sent %d GETs of the weights, want 0", n)
	}
}
