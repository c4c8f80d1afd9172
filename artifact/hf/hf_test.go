package hf

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/artifact/layout"
	"github.com/modelpack/modelpack/artifact/pack"
	"github.com/modelpack/modelpack/internal/errdef"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testenv/hubserver"
)

func TestParseReference(t *testing.T) {
	for in, want := range map[string]Ref{
		"hf://acme/tiny":                   {"acme/tiny", "main"},
		"hf://acme/tiny@v1.0":              {"acme/tiny", "v1.0"},
		"hf://Qwen/Qwen2.5-0.5B@refs/pr/1": {"Qwen/Qwen2.5-0.5B", "refs/pr/1"},
		"hf://datasets/acme/corpus@v2":     {"datasets/acme/corpus", "v2"},
	} {
		got, err := ParseReference(in)
		if err != nil || got != want {
			t.Errorf("%s: %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"acme/tiny", "hf://", "hf://acme/tiny@", "hf://a/b/c", "hf://acme/../x", "hf://acme/ti--ny",
		"hf://spaces/acme/x", "hf://datasets/acme", "hf://datasets/datasets/x/y", "hf://datasets/a--b/x", "hf://acme/tiny@a b", "hf://acme/tiny@../x", "hf://-acme/x", "hf://acme/x.", "hf://acme//x", "hf://Qwen", "hf://gpt2@main"} {
		if _, err := ParseReference(in); err == nil || !strings.Contains(err.Error(), "want hf://ORG/NAME, hf://datasets/ORG/NAME") {
			t.Errorf("%s: %v", in, err)
		}
	}
}

func FuzzParseReference(f *testing.F) {
	for _, s := range []string{"hf://acme/tiny", "hf://acme/tiny@main", "hf://gpt2@refs/pr/1", "hf://a/b@c@d", "hf://a/../b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseReference(s)
		if err != nil {
			return
		}
		// What parses names one repository and one revision, which reach the Hub as path components without
		// escaping its API's path or the repository.
		for _, p := range strings.Split(r.Repo, "/") {
			if p == "" || p == "." || p == ".." || strings.ContainsAny(p, "?#%@ ") {
				t.Fatalf("%q: repository %q", s, r.Repo)
			}
		}
		if r.Revision == "" || strings.Contains(url.PathEscape(r.Revision), "/") {
			t.Fatalf("%q: revision %q", s, r.Revision)
		}
		if again, err := ParseReference(r.String()); err != nil || again != r {
			t.Fatalf("%q: %v does not round-trip (%+v, %v)", s, r, again, err)
		}
	})
}

func FuzzParseTree(f *testing.F) {
	f.Add([]byte(`[{"type":"file","oid":"0123456789012345678901234567890123456789","size":3,"path":"a/b.json"}]`))
	f.Add([]byte(`[{"type":"file","oid":"0123456789012345678901234567890123456789","size":9,"path":"w.safetensors","lfs":{"oid":"` + strings.Repeat("ab", 32) + `","size":9,"pointerSize":130}},{"type":"directory","path":"a","oid":"x","size":0}]`))
	f.Add([]byte(`[{"type":"file","path":"../x","size":1,"oid":"0123456789012345678901234567890123456789"}]`))
	f.Add([]byte(`[{"type":"file","oid":"0123456789012345678901234567890123456789","size":3,"path":"cfg"},{"type":"file","oid":"0123456789012345678901234567890123456789","size":3,"path":"cfg/w"}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, err := ParseTree(b)
		if err != nil {
			return
		}
		for _, e := range entries {
			if e.Type != "file" {
				continue
			}
			if !cleanPath(e.Path) || e.Size < 0 {
				t.Fatalf("accepted %+v", e)
			}
			if e.LFS != nil && (!isHex(e.LFS.OID, 64) || e.LFS.Size != e.Size) {
				t.Fatalf("accepted LFS %+v", e.LFS)
			}
			if e.LFS == nil && !isHex(e.OID, 40) {
				t.Fatalf("accepted oid %q", e.OID)
			}
		}
		// A listing checkPaths accepts unpacks: no file is another's directory, no path comes twice.
		if checkPaths(entries) != nil {
			return
		}
		files := map[string]bool{}
		for _, e := range entries {
			if e.Type == "file" {
				if files[e.Path] {
					t.Fatalf("accepted %q twice", e.Path)
				}
				files[e.Path] = true
			}
		}
		for p := range files {
			for d := path.Dir(p); d != "."; d = path.Dir(d) {
				if files[d] {
					t.Fatalf("accepted %q inside the file %q", p, d)
				}
			}
		}
	})
}

func FuzzNextLink(f *testing.F) {
	f.Add(`<https://hub/api/models/a/b/tree/main?cursor=x>; rel="next"`)
	f.Add(`<a>; rel=prev, </b?c=1>; rel="next"`)
	base, _ := url.Parse("http://127.0.0.1:1/api/models/a/b/tree/main")
	f.Fuzz(func(t *testing.T, v string) {
		next := nextLink([]string{v}, base)
		if next == "" {
			return
		}
		if _, err := url.Parse(next); err != nil {
			t.Fatalf("%q gave %q: %v", v, next, err)
		}
	})
}

// The client reads what the Hub states and what it serves, and says what to do when the Hub refuses.
func TestClient(t *testing.T) {
	files := map[string][]byte{"config.json": []byte(`{"model_type":"llama"}`), "w.safetensors": []byte(strings.Repeat("w", 5000))}
	for i := range 7 {
		files["extra/"+string(rune('a'+i))+".txt"] = []byte{byte(i)}
	}
	s := hubserver.Start(t, hubserver.Repo{Name: "acme/tiny", Files: files, CardData: map[string]any{"license": []string{"mit", "other"}, "license_name": "acme-1"}},
		hubserver.Repo{Name: "acme/gated", Files: files, Token: "hf_x"})
	s.PageSize = 2
	c, err := NewClient(s.URL+"/", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	snap, err := c.Snapshot(ctx, Ref{Repo: "acme/tiny", Revision: "main"}, Options{Exclude: []string{"extra/[a-c].txt"}})
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	if snap.Commit != s.Commit("acme/tiny") || len(snap.Remote) != 1 || snap.Remote[0].Path != "w.safetensors" ||
		snap.Remote[0].Digest.Encoded() != s.SHA256("acme/tiny", "w.safetensors") {
		t.Errorf("snapshot %+v", snap)
	}
	if got := strings.Join(snap.Descriptor.Licenses, ","); got != "MIT,acme-1" {
		t.Errorf("licenses %s", got)
	}
	rc, start, err := snap.Remote[0].Open(ctx, 4000)
	if err != nil || start != 4000 {
		t.Fatalf("open at 4000: %d, %v", start, err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || len(b) != 1000 {
		t.Fatalf("read from 4000: %d bytes, %v", len(b), err)
	}

	for ref, want := range map[Ref]error{
		{Repo: "acme/gated", Revision: "main"}:  errdef.ErrUnauthorized,
		{Repo: "acme/tiny", Revision: "nope"}:   errdef.ErrNotFound,
		{Repo: "acme/absent", Revision: "main"}: errdef.ErrNotFound,
	} {
		_, err := c.Info(ctx, ref)
		if !errors.Is(err, want) || !strings.Contains(err.Error(), ref.String()) {
			t.Errorf("%s: %v, want %v", ref, err, want)
		}
	}
	if _, err := c.Info(ctx, Ref{Repo: "acme/absent", Revision: "main"}); !strings.Contains(err.Error(), "HF_TOKEN") {
		t.Errorf("a repository the Hub hides: %v", err)
	}

	// Rate limiting past the attempts allowed ends with a message, not a hang.
	s.RetryAfter, s.RateLimit, c.RateLimitAttempts = "0", 3, 3
	if _, err := c.Info(ctx, Ref{Repo: "acme/tiny", Revision: "main"}); !errors.Is(err, errdef.ErrUnavailable) || !strings.Contains(err.Error(), "429") {
		t.Errorf("rate limited: %v", err)
	}
	s.RetryAfter, s.RateLimit = "3600", 1
	if _, err := c.Info(ctx, Ref{Repo: "acme/tiny", Revision: "main"}); err == nil || !strings.Contains(err.Error(), "asks to wait 1h0m0s") {
		t.Errorf("a Retry-After past the cap: %v", err)
	}
}

func TestTokenFromEnv(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HF_TOKEN", "")
	t.Setenv("HF_TOKEN_PATH", "")
	t.Setenv("HF_HOME", home)
	if tok := tokenFromEnv(); tok != "" {
		t.Fatalf("no token anywhere gave %q", tok)
	}
	writeFile(t, home+"/token", "hf_file\n")
	if tok := tokenFromEnv(); tok != "hf_file" {
		t.Errorf("$HF_HOME/token gave %q", tok)
	}
	writeFile(t, home+"/other", "hf_path")
	t.Setenv("HF_TOKEN_PATH", home+"/other")
	if tok := tokenFromEnv(); tok != "hf_path" {
		t.Errorf("HF_TOKEN_PATH gave %q", tok)
	}
	t.Setenv("HF_TOKEN", "hf_env")
	if tok := tokenFromEnv(); tok != "hf_env" {
		t.Errorf("HF_TOKEN gave %q", tok)
	}
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A pack interrupted part way through an LFS file resumes, on the next run, from the bytes the store kept: the
// Hub is asked for the rest with a Range, and the layer is the file.
func TestSnapshotResumesAcrossRuns(t *testing.T) {
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	s := hubserver.Start(t, hubserver.Repo{Name: "acme/tiny", Files: map[string][]byte{"w.bin": data, "config.json": []byte("{}")}})
	c, err := NewClient(s.URL, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	store, err := layout.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	packOnce := func(ctx context.Context) error {
		snap, err := c.Snapshot(ctx, Ref{Repo: "acme/tiny", Revision: "main"}, Options{})
		if err != nil {
			return err
		}
		defer snap.Close()
		_, err = pack.Pack(ctx, snap.Dir, pack.Options{Tag: "tiny:v1", Remote: snap.Remote, Created: snap.Created}, store.Sink())
		return err
	}
	sha := s.SHA256("acme/tiny", "w.bin")
	const kept = 1 << 20
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Interrupt once the store holds what was sent: the download is then waiting for bytes that do not come.
	s.StallAfter[sha], s.OnStall = kept, func() {
		go func() {
			defer cancel()
			for range 1000 {
				partials, _ := filepath.Glob(filepath.Join(root, "ingest", "*.partial"))
				if len(partials) == 1 {
					if fi, err := os.Stat(partials[0]); err == nil && fi.Size() >= kept {
						return
					}
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	if err := packOnce(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted pack: %v", err)
	}
	if err := packOnce(context.Background()); err != nil {
		t.Fatalf("second pack: %v", err)
	}
	var ranges []string
	for _, r := range s.Requests() {
		if r.Host == "download" {
			ranges = append(ranges, r.Range)
		}
	}
	if len(ranges) != 2 || ranges[0] != "" || !strings.HasPrefix(ranges[1], "bytes=") || ranges[1] == "bytes=0-" {
		t.Fatalf("download requests' ranges %q: want the whole file, then the rest", ranges)
	}
	t.Logf("ranges %q", ranges)
	if got, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(ranges[1], "bytes="), "-"), 10, 64); got < kept/2 || got > kept {
		t.Errorf("resumed at %d, %d bytes were sent before the interruption", got, kept)
	}
	desc, err := store.Resolve(context.Background(), "tiny:v1")
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := store.Exists(context.Background(), ocispec.Descriptor{Digest: digest.FromBytes(data), Size: int64(len(data))}); !ok {
		t.Errorf("%s: the store lacks w.bin's blob", desc.Digest)
	}
}

// A Hub that accepts the connection and says nothing, that stops part way through an answer, or that trickles it a
// byte at a time, fails the request with ErrUnavailable and a message that says so, instead of holding a pack for
// ever; a pre-signed URL's query, its signature, is in no error.
func TestClientNeverWaitsOnASilentHub(t *testing.T) {
	const idle = 300 * time.Millisecond
	// The deadline only keeps a regression from hanging the suite; the checks are on the errors.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ref := Ref{Repo: "acme/tiny", Revision: "main"}
	check := func(what string, err error, want string) {
		t.Helper()
		if !errors.Is(err, errdef.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want ErrUnavailable saying %q", what, err, want)
		}
		if err != nil && (!strings.Contains(err.Error(), "Hugging Face Hub unavailable") || strings.Contains(err.Error(), "registry")) {
			t.Errorf("%s: %v; want it said of the Hub, not of a registry", what, err)
		}
	}

	hung := testenv.StartHungServer(t)
	c, err := NewClient("http://"+hung.Host, "", idle)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Info(ctx, ref)
	check("a Hub that never answers", err, "no byte for 300ms")
	_, err = c.do(ctx, "GET", "http://"+hung.Host+"/lfs/x?sig=s3cr3t", "a download", nil, nil)
	check("a download host that never answers", err, "no byte for 300ms")
	if err != nil && strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("the error quotes the pre-signed URL's query: %v", err)
	}
	if hung.Accepted() == 0 {
		t.Fatal("the hung server received no connection")
	}

	s := hubserver.Start(t, hubserver.Repo{Name: "acme/tiny", Files: map[string][]byte{"config.json": []byte("{}"), "w.safetensors": make([]byte, 20000)}})
	if c, err = NewClient(s.URL, "", idle); err != nil {
		t.Fatal(err)
	}
	s.StallAPI["revision"] = 1
	_, err = c.Info(ctx, ref)
	check("model info stopping half way", err, "no byte for 300ms")
	s.StallAPI["tree"] = 1
	_, err = c.Tree(ctx, "acme/tiny", s.Commit("acme/tiny"))
	check("the file list stopping half way", err, "no byte for 300ms")
	s.TrickleAPI = idle / 3
	_, err = c.Info(ctx, ref)
	check("model info trickling", err, "did not arrive within 1.2s")
	s.TrickleAPI = 0
	if _, err := c.Info(ctx, ref); err != nil {
		t.Fatalf("the Hub answering again: %v", err)
	}
}

// HF_HUB_DOWNLOAD_TIMEOUT, huggingface_hub's setting, bounds the client's waits; a value that is not a positive
// number of seconds is refused by name.
func TestDownloadTimeoutFromEnv(t *testing.T) {
	t.Setenv("HF_ENDPOINT", "http://127.0.0.1:1")
	for v, want := range map[string]time.Duration{"": 30 * time.Second, "12": 12 * time.Second, "0.5": 500 * time.Millisecond} {
		t.Setenv("HF_HUB_DOWNLOAD_TIMEOUT", v)
		c, err := FromEnv()
		if err != nil || c.idle != want {
			t.Errorf("HF_HUB_DOWNLOAD_TIMEOUT=%q: %v, %v; want %s", v, c, err, want)
		}
	}
	for _, v := range []string{"0", "-3", "ten", "1e9"} {
		t.Setenv("HF_HUB_DOWNLOAD_TIMEOUT", v)
		if _, err := FromEnv(); err == nil || !strings.Contains(err.Error(), "HF_HUB_DOWNLOAD_TIMEOUT") {
			t.Errorf("HF_HUB_DOWNLOAD_TIMEOUT=%q: %v; want an error naming it", v, err)
		}
	}
}

// A file outside LFS streams to disk as its git blob id is checked: the Hub states its size, and a listing of large
// ones is never held in memory; one whose bytes differ is refused and removed.
func TestNonLFSFilesStream(t *testing.T) {
	big := make([]byte, 48<<20)
	for i := range big {
		big[i] = byte(i * 13)
	}
	s := hubserver.Start(t, hubserver.Repo{Name: "acme/plain", Files: map[string][]byte{"config.json": []byte("{}"), "vocab.bin": big},
		LFS: func(string, int) bool { return false }})
	c, err := NewClient(s.URL, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ref := Ref{Repo: "acme/plain", Revision: "main"}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	snap, err := c.Snapshot(ctx, ref, Options{TempDir: t.TempDir()})
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	if got, _ := os.ReadFile(filepath.Join(snap.Dir, "vocab.bin")); !bytes.Equal(got, big) {
		t.Fatalf("vocab.bin: %d bytes, not the Hub's", len(got))
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(len(big))/4 {
		t.Errorf("snapshot of a %d MiB plain file allocated %d MiB: it was held in memory", len(big)>>20, alloc>>20)
	}

	s.Corrupt[s.SHA256("acme/plain", "vocab.bin")] = true
	tmp := t.TempDir()
	if _, err := c.Snapshot(ctx, ref, Options{TempDir: tmp}); !errors.Is(err, errdef.ErrDigestMismatch) || !strings.Contains(err.Error(), "vocab.bin") {
		t.Fatalf("corrupted plain file: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "*", "vocab.bin")); len(left) != 0 {
		t.Errorf("the refused bytes stay on disk: %v", left)
	}
}

// A listing longer than any model's is refused, page by page, before it is all held.
func TestTreeIsBounded(t *testing.T) {
	files := map[string][]byte{}
	for i := range 30 {
		files[fmt.Sprintf("f%02d.txt", i)] = []byte{byte(i)}
	}
	s := hubserver.Start(t, hubserver.Repo{Name: "acme/many", Files: files})
	s.PageSize = 10
	c, err := NewClient(s.URL, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func(n int) { maxTreeEntries = n }(maxTreeEntries)
	maxTreeEntries = 25
	if _, err := c.Tree(context.Background(), "acme/many", s.Commit("acme/many")); err == nil || !strings.Contains(err.Error(), "more than 25 files") {
		t.Fatalf("a listing of 30 files against a bound of 25: %v", err)
	}
	pages := 0
	for _, r := range s.Requests() {
		if strings.Contains(r.Path, "/tree/") {
			pages++
		}
	}
	if pages != 3 {
		t.Errorf("%d pages read; want 3, the one past the bound last", pages)
	}
	maxTreeEntries = 30
	if entries, err := c.Tree(context.Background(), "acme/many", s.Commit("acme/many")); err != nil || len(entries) != 30 {
		t.Fatalf("a listing at the bound: %d entries, %v", len(entries), err)
	}
}
