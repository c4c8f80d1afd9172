package remote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
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

// A resumable upload that fails for good (the registry refuses the digest) cancels its session on the registry and
// forgets it, so nothing is left behind to resume.
func TestResumablePushCancelsSessionOnFinalError(t *testing.T) {
	reg, opts := plainRegistry(t)
	repo := repoFor(t, reg.Host+"/cancel/me:v1", opts)
	data := randBytes(t, resumableMin+1<<20)
	desc := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromString("not these bytes"), Size: int64(len(data))}
	s := &memSessions{}
	err := transferBlob(context.Background(), anyBytes(data), repo, nil, desc, newTracker(nil), s)
	if err == nil {
		t.Fatal("a blob whose bytes do not match its digest was accepted")
	}
	if len(s.history) == 0 {
		t.Fatal("no upload session was kept: the blob did not go through the resumable upload")
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
	data := randBytes(t, resumableMin+1<<20)
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

// cutBody fails the request body once total passes cutAt: the connection to the registry is cut mid-blob.
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

// exchange is one request through a test proxy and what the registry answered to it.
type exchange struct {
	method, path, contentRange, auth string
	status                           int
	rangeHdr                         string
}

// exchangeLog records every request through a proxy and the registry's answer, in order.
type exchangeLog struct {
	mu  sync.Mutex
	all []exchange
}

func (l *exchangeLog) hooks(cut func(r *http.Request)) testenv.ProxyHooks {
	return testenv.ProxyHooks{
		Request: func(_ http.ResponseWriter, r *http.Request) bool {
			if cut != nil {
				cut(r)
			}
			return true
		},
		Response: func(resp *http.Response) {
			r := resp.Request
			l.mu.Lock()
			l.all = append(l.all, exchange{method: r.Method, path: r.URL.Path, contentRange: r.Header.Get("Content-Range"),
				auth: r.Header.Get("Authorization"), status: resp.StatusCode, rangeHdr: resp.Header.Get("Range")})
			l.mu.Unlock()
		},
	}
}

func (l *exchangeLog) list() []exchange {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.all)
}

// checkBlob fails unless the registry serves desc's bytes, verified against its digest and size; user "" reads
// without credentials.
func checkBlob(t *testing.T, registryHost, repo string, desc ocispec.Descriptor, user, pass string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+registryHost+"/v2/"+repo+"/blobs/"+desc.Digest.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET of the pushed blob: %s", resp.Status)
	}
	v := desc.Digest.Verifier()
	n, err := io.Copy(v, resp.Body)
	if err != nil || n != desc.Size || !v.Verified() {
		t.Fatalf("the registry serves %d bytes (%v) for a %d byte blob, verified %v", n, err, desc.Size, v.Verified())
	}
}

// An upload whose connection is cut in the middle of the blob asks the registry how far its session got (GET,
// Range) and continues from there with a PUT of the rest (Content-Range), instead of sending the blob from the start; the blob
// the registry then serves is the one pushed.
func TestResumablePushContinuesAfterCutConnection(t *testing.T) {
	reg, opts := plainRegistry(t)
	var total atomic.Int64
	var cut atomic.Bool
	const cutAt = 12 << 20
	var log exchangeLog
	host := testenv.StartProxy(t, reg.Host, log.hooks(func(r *http.Request) {
		if r.Body != nil && r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/blobs/uploads/") {
			r.Body = &cutBody{ReadCloser: r.Body, total: &total, cutAt: cutAt, cut: &cut}
		}
	})).Host
	repo := repoFor(t, host+"/cut/c:v1", opts)
	data := randBytes(t, 32<<20)
	desc := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(data), Size: int64(len(data))}
	if err := transferBlob(context.Background(), anyBytes(data), repo, nil, desc, newTracker(nil), &memSessions{}); err != nil {
		t.Fatal(err)
	}
	if !cut.Load() {
		t.Fatal("the connection was never cut")
	}
	checkBlob(t, reg.Host, "cut/c", desc, "", "")

	// After the cut PUT: a GET of the session, then one PUT from the byte its Range says the registry holds.
	ex := log.list()
	i := slices.IndexFunc(ex, func(e exchange) bool {
		return e.method == http.MethodGet && strings.Contains(e.path, "/blobs/uploads/")
	})
	if i < 0 {
		t.Fatalf("no GET of the upload session after the cut: %+v", ex)
	}
	held, ok := parseUploadRange(ex[i].rangeHdr)
	if ex[i].status != http.StatusNoContent || !ok || held == 0 {
		t.Fatalf("the session's status after the cut: %d Range %q; want 204 with the bytes received before the cut", ex[i].status, ex[i].rangeHdr)
	}
	var puts []exchange
	for _, e := range ex[i+1:] {
		if e.method == http.MethodPut || e.method == http.MethodPatch {
			puts = append(puts, e)
		}
	}
	want := fmt.Sprintf("%d-%d", held, desc.Size-1)
	if len(puts) != 1 || puts[0].method != http.MethodPut || puts[0].contentRange != want || puts[0].status != http.StatusCreated {
		t.Fatalf("after the registry said it holds %d bytes: uploads %+v, want one PUT of Content-Range %s", held, puts, want)
	}
	t.Logf("sent %d bytes for a %d byte blob cut at %d; resumed from %d", total.Load(), desc.Size, cutAt, held)
	if got := total.Load(); got >= desc.Size+cutAt/2 {
		t.Errorf("sent %d bytes for a %d byte blob cut at byte %d: it started over", got, desc.Size, int64(cutAt))
	}
}

// A large blob to a registry with basic auth (distribution, htpasswd: a bcrypt check on every request) costs a
// fixed number of requests whatever its size, as oras-go's push does: the upload's POST (and its challenge), then
// one PUT streaming the blob and committing it; not one request per chunk. The PUT carries the credentials the
// POST was challenged for.
func TestResumablePushWithCredentialsCostsFewRequests(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: htpasswd(t, "alice", "s3cret")})
	var log exchangeLog
	host := testenv.StartProxy(t, reg.Host, log.hooks(nil)).Host
	cred := func(context.Context, string) (auth.Credential, error) {
		return auth.Credential{Username: "alice", Password: "s3cret"}, nil
	}
	opts := Options{PlainHTTP: true, RegistryConfig: filepath.Join(t.TempDir(), "none.json"), Credential: cred}
	repo := repoFor(t, host+"/auth/c:v1", opts)
	const mib = 48
	data := randBytes(t, mib<<20)
	desc := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(data), Size: int64(len(data))}
	s := &memSessions{}
	if err := transferBlob(context.Background(), anyBytes(data), repo, nil, desc, newTracker(nil), s); err != nil {
		t.Fatal(err)
	}
	if len(s.history) == 0 {
		t.Fatal("no upload session was kept: the blob did not go through the resumable upload")
	}
	ex := log.list()
	var uploads int
	for _, e := range ex {
		if e.method == http.MethodPatch || e.method == http.MethodPut {
			uploads++
			if e.auth == "" || e.status != http.StatusCreated {
				t.Errorf("upload without credentials or refused: %+v", e)
			}
		}
	}
	t.Logf("%d requests for a %d MiB blob: %+v", len(ex), mib, ex)
	if uploads != 1 || len(ex) > 3 {
		t.Errorf("%d requests (%d carrying the blob) for a %d MiB blob; want one PUT and at most 3 requests (POST, its challenge, PUT)", len(ex), uploads, mib)
	}
	if ok, err := repo.Exists(context.Background(), desc); err != nil || !ok {
		t.Fatalf("the blob is not on the registry: %v %v", ok, err)
	}
	checkBlob(t, reg.Host, "auth/c", desc, "alice", "s3cret")
}

// A push to a registry with basic auth asks about each blob once: the manifests' copy takes the blobs the first
// phase uploaded as present instead of asking again (each question a bcrypt check on the registry), and the root
// manifest goes up with its tag in one PUT.
func TestPushAsksAboutEachBlobOnce(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Htpasswd: htpasswd(t, "alice", "s3cret")})
	var log exchangeLog
	host := testenv.StartProxy(t, reg.Host, log.hooks(nil)).Host
	cred := func(context.Context, string) (auth.Credential, error) {
		return auth.Credential{Username: "alice", Password: "s3cret"}, nil
	}
	opts := Options{PlainHTTP: true, RegistryConfig: filepath.Join(t.TempDir(), "none.json"), Credential: cred}
	m := buildModel(t, 256<<10)
	if _, err := Push(context.Background(), m.store, m.ref, repoFor(t, host+"/team/model:v1", opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	heads := map[string]int{}
	var manifestPuts []string
	for _, e := range log.list() {
		if e.status == http.StatusUnauthorized {
			continue // the challenge of a request sent before the client knew the scheme
		}
		if e.method == http.MethodHead && strings.Contains(e.path, "/blobs/") {
			heads[e.path]++
		}
		if e.method == http.MethodPut && strings.Contains(e.path, "/manifests/") {
			manifestPuts = append(manifestPuts, e.path)
		}
	}
	if len(heads) != len(m.blobs) {
		t.Errorf("HEADs of %d blobs for a model of %d: %v", len(heads), len(m.blobs), heads)
	}
	for p, n := range heads {
		if n != 1 {
			t.Errorf("%s asked about %d times, want once", p, n)
		}
	}
	if len(manifestPuts) != 1 || !strings.HasSuffix(manifestPuts[0], "/manifests/v1") {
		t.Errorf("manifest PUTs %v, want one, by tag", manifestPuts)
	}
}

// An upload the registry refuses with 416 (its session is not where it said) is not the end of the push: the session
// is asked again, and one that still says the refused offset is replaced by a new session.
func TestResumablePushRefusedRangeStartsNewSession(t *testing.T) {
	reg, opts := plainRegistry(t)
	var refused atomic.Bool
	var log exchangeLog
	hooks := log.hooks(nil)
	hooks.Request = func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/blobs/uploads/") && refused.CompareAndSwap(false, true) {
			w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
			return false
		}
		return true
	}
	host := testenv.StartProxy(t, reg.Host, hooks).Host
	repo := repoFor(t, host+"/refused/r:v1", opts)
	data := randBytes(t, resumableMin+1<<20)
	desc := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(data), Size: int64(len(data))}
	if err := transferBlob(context.Background(), anyBytes(data), repo, nil, desc, newTracker(nil), &memSessions{}); err != nil {
		t.Fatal(err)
	}
	if !refused.Load() {
		t.Fatal("no upload was refused")
	}
	var posts, gets int
	for _, e := range log.list() {
		switch e.method {
		case http.MethodPost:
			posts++
		case http.MethodGet:
			gets++
		}
	}
	if gets == 0 || posts != 2 {
		t.Errorf("%d GETs of the session and %d POSTs after a refused upload; want the session asked, then a new one", gets, posts)
	}
	checkBlob(t, reg.Host, "refused/r", desc, "", "")
}
