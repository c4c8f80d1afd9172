package remote

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/modelpack/modelpack/internal/testenv"
)

// memSessions is an UploadSessions in memory that keeps every location it was given.
type memSessions struct {
	mu      sync.Mutex
	cur     map[digest.Digest]string
	history []string
}

func (s *memSessions) UploadSession(_, _ string, d digest.Digest) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur[d]
}

func (s *memSessions) RecordUploadSession(_, _ string, d digest.Digest, loc string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		s.cur = map[digest.Digest]string{}
	}
	s.cur[d] = loc
	if loc != "" {
		s.history = append(s.history, loc)
	}
	return nil
}

// anyBytes serves its bytes for every descriptor, whatever digest the descriptor states.
type anyBytes []byte

func (b anyBytes) Fetch(context.Context, ocispec.Descriptor) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(b)), nil
}

// A chunked upload that fails for good (the registry refuses the digest) cancels its session on the registry and
// forgets it, so nothing is left behind to resume.
func TestResumablePushCancelsSessionOnFinalError(t *testing.T) {
	reg, opts := plainRegistry(t)
	repo := repoFor(t, reg.Host+"/cancel/me:v1", opts)
	data := randBytes(t, uploadChunk+1<<20)
	desc := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromString("not these bytes"), Size: int64(len(data))}
	s := &memSessions{}
	err := transferBlob(context.Background(), anyBytes(data), repo, nil, desc, newTracker(nil), s)
	if err == nil {
		t.Fatal("a blob whose bytes do not match its digest was accepted")
	}
	if len(s.history) == 0 {
		t.Fatal("no upload session was kept: the blob did not go through the chunked upload")
	}
	if got := s.UploadSession("", "", desc.Digest); got != "" {
		t.Errorf("the failed session is still remembered: %s", got)
	}
	resp, gerr := http.Get(s.history[len(s.history)-1])
	if gerr != nil {
		t.Fatal(gerr)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("the registry still has the failed session: GET gave %s, want 404", resp.Status)
	}
}

// A remembered session the registry no longer knows (expired, garbage-collected, another registry's) is dropped
// and the blob sent from the start.
func TestResumablePushStaleSessionStartsOver(t *testing.T) {
	reg, opts := plainRegistry(t)
	repo := repoFor(t, reg.Host+"/stale/s:v1", opts)
	data := randBytes(t, uploadChunk+1<<20)
	desc := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(data), Size: int64(len(data))}
	s := &memSessions{}
	s.RecordUploadSession("", "", desc.Digest, "http://"+reg.Host+"/v2/stale/s/blobs/uploads/00000000-0000-0000-0000-000000000000?_state=bogus")
	if err := transferBlob(context.Background(), anyBytes(data), repo, nil, desc, newTracker(nil), s); err != nil {
		t.Fatal(err)
	}
	if ok, err := repo.Exists(context.Background(), desc); err != nil || !ok {
		t.Fatalf("the blob is not on the registry after the push: %v %v", ok, err)
	}
	if got := s.UploadSession("", "", desc.Digest); got != "" {
		t.Errorf("the finished session is still remembered: %s", got)
	}
}

// cutBody fails the request body once total passes cutAt: the connection to the registry is cut mid-chunk.
type cutBody struct {
	io.ReadCloser
	total *atomic.Int64
	cutAt int64
	cut   *atomic.Bool
}

func (b *cutBody) Read(p []byte) (int, error) {
	if b.total.Load() >= b.cutAt && b.cut.CompareAndSwap(false, true) {
		return 0, errors.New("connection cut by the test")
	}
	n, err := b.ReadCloser.Read(p)
	b.total.Add(int64(n))
	return n, err
}

// An upload whose connection is cut in the middle of a chunk continues from the bytes the registry's session
// holds (GET, Range) instead of sending the blob from the start.
func TestResumablePushContinuesAfterCutConnection(t *testing.T) {
	reg, opts := plainRegistry(t)
	var total atomic.Int64
	var cut atomic.Bool
	const cutAt = 12 << 20 // inside the second chunk
	host := testenv.StartProxy(t, reg.Host, testenv.ProxyHooks{Request: func(_ http.ResponseWriter, r *http.Request) bool {
		if r.Body != nil && r.Method == http.MethodPatch {
			r.Body = &cutBody{ReadCloser: r.Body, total: &total, cutAt: cutAt, cut: &cut}
		}
		return true
	}}).Host
	repo := repoFor(t, host+"/cut/c:v1", opts)
	data := randBytes(t, 4*uploadChunk)
	desc := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(data), Size: int64(len(data))}
	if err := transferBlob(context.Background(), anyBytes(data), repo, nil, desc, newTracker(nil), &memSessions{}); err != nil {
		t.Fatal(err)
	}
	if !cut.Load() {
		t.Fatal("the connection was never cut")
	}
	if ok, err := repo.Exists(context.Background(), desc); err != nil || !ok {
		t.Fatalf("the blob is not on the registry: %v %v", ok, err)
	}
	// Starting over would send the blob plus the 12 MiB before the cut.
	t.Logf("sent %d bytes for a %d byte blob cut at %d", total.Load(), desc.Size, cutAt)
	if got := total.Load(); got >= desc.Size+uploadChunk/2 {
		t.Errorf("sent %d bytes for a %d byte blob cut at byte %d: it started over", got, desc.Size, int64(cutAt))
	}
}

// The chunked upload authenticates as oras-go's requests do: its PATCHes carry the credentials a registry that
// requires them challenged the session's POST for.
func TestResumablePushWithCredentials(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: htpasswd(t, "alice", "s3cret")})
	cred := func(context.Context, string) (auth.Credential, error) {
		return auth.Credential{Username: "alice", Password: "s3cret"}, nil
	}
	opts := Options{PlainHTTP: true, RegistryConfig: filepath.Join(t.TempDir(), "none.json"), Credential: cred}
	repo := repoFor(t, reg.Host+"/auth/c:v1", opts)
	data := randBytes(t, 2*uploadChunk+1)
	desc := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(data), Size: int64(len(data))}
	s := &memSessions{}
	if err := transferBlob(context.Background(), anyBytes(data), repo, nil, desc, newTracker(nil), s); err != nil {
		t.Fatal(err)
	}
	if len(s.history) < 3 {
		t.Fatalf("%d session locations kept, want one per chunk: the blob did not go in chunks", len(s.history))
	}
	if ok, err := repo.Exists(context.Background(), desc); err != nil || !ok {
		t.Fatalf("the blob is not on the registry: %v %v", ok, err)
	}
}
