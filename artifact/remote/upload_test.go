package remote

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
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
