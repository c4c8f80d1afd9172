package cli

import (
	"crypto/rand"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// countingProxy fronts a real registry and counts the request bytes clients send it (blob uploads) and the
// cross-repository mount requests.
type countingProxy struct {
	Host   string
	sent   atomic.Int64
	mu     sync.Mutex
	mounts []string
}

func startCountingProxy(t *testing.T, reg *testenv.Registry) *countingProxy {
	t.Helper()
	p := &countingProxy{}
	p.Host = testenv.StartProxy(t, reg.Host, testenv.ProxyHooks{Request: func(_ http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodPost && r.URL.Query().Get("mount") != "" {
			p.mu.Lock()
			p.mounts = append(p.mounts, r.URL.Query().Get("from"))
			p.mu.Unlock()
		}
		if r.Body != nil {
			r.Body = struct {
				io.Reader
				io.Closer
			}{io.TeeReader(r.Body, writerFunc(func(b []byte) { p.sent.Add(int64(len(b))) })), r.Body}
		}
		return true
	}}).Host
	return p
}

type writerFunc func([]byte)

func (f writerFunc) Write(b []byte) (int, error) { f(b); return len(b), nil }

// Item: push mounts a blob from another repository of the same registry where this store pushed (or pulled) it,
// as copy does, instead of sending its bytes again; the registry is asked through a proxy that counts them.
func TestPushMountsFromAnotherRepository(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	proxy := startCountingProxy(t, reg)
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir())
	model := smallModel(t)
	weights := make([]byte, 8<<20)
	rand.Read(weights)
	os.WriteFile(filepath.Join(model, "extra.safetensors.bin"), weights, 0o644)
	home := t.TempDir()
	mustRun := func(args ...string) {
		t.Helper()
		if code, _, stderr := run(append([]string{"--home", home}, args...)...); code != 0 {
			t.Fatalf("%v: %s", args, stderr)
		}
	}
	mustRun("pack", model, "-t", "llama:v1", "-q")
	mustRun("push", proxy.Host+"/team-a/llama:v1", "--from", "llama:v1", "--plain-http", "-q")
	first := proxy.sent.Load()
	if first < int64(len(weights)) {
		t.Fatalf("the first push sent %d bytes, less than the model", first)
	}
	proxy.sent.Store(0)
	mustRun("push", proxy.Host+"/team-b/llama:v1", "--from", "llama:v1", "--plain-http", "-q")
	if sent := proxy.sent.Load(); sent > 64<<10 {
		t.Fatalf("the push to another repository of the registry sent %d bytes again (first push: %d), mounts asked: %v", sent, first, proxy.mounts)
	}
	if len(proxy.mounts) == 0 || proxy.mounts[0] != "team-a/llama" {
		t.Fatalf("mount requests: %v", proxy.mounts)
	}

	// What a pull brought in is mounted too: another store pulls from team-b and pushes to team-c.
	other := t.TempDir()
	if code, _, stderr := run("--home", other, "pull", proxy.Host+"/team-b/llama:v1", "--plain-http", "-q"); code != 0 {
		t.Fatal(stderr)
	}
	proxy.sent.Store(0)
	if code, _, stderr := run("--home", other, "push", proxy.Host+"/team-c/llama:v1", "--from", proxy.Host+"/team-b/llama:v1", "--plain-http", "-q"); code != 0 {
		t.Fatal(stderr)
	}
	if sent := proxy.sent.Load(); sent > 64<<10 {
		t.Fatalf("the push of a pulled model to another repository sent %d bytes", sent)
	}
}
