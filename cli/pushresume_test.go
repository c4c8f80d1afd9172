package cli

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// gatedReader counts upload bytes and, once past limit, tells reached and holds until gate opens.
type gatedReader struct {
	r       io.Reader
	sent    *atomic.Int64
	limit   *atomic.Int64
	reached func()
	gate    <-chan struct{}
}

func (g *gatedReader) Read(p []byte) (int, error) {
	if g.sent.Load() > g.limit.Load() {
		g.reached()
		<-g.gate
	}
	n, err := g.r.Read(p)
	g.sent.Add(int64(n))
	return n, err
}

// Item: a push interrupted part way through a large blob (SIGINT) resumes on the next run from the bytes the
// registry's upload session holds (GET on the remembered upload location, Range header) instead of sending the
// whole blob again.
func TestInterruptedPushResumes(t *testing.T) {
	bin := testenv.Modelpack(t)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	model := t.TempDir()
	const shardSize = 32 << 20
	if err := testmodel.Generate(model, testmodel.Spec{Shards: 1, ShardSize: shardSize, Seed: 21}); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	run := binaryRunner(t)
	if code, _, stderr := run("--home", home, "pack", model, "-t", "m:v1", "-q"); code != 0 {
		t.Fatalf("pack: %s", stderr)
	}

	// The first run goes through a proxy that holds the upload once 12 MiB have passed: the shard is mid-way.
	// The session's location names the registry as the push reached it, so both runs go through the same proxy.
	var sent, limit atomic.Int64
	limit.Store(12 << 20)
	gate := make(chan struct{})
	reached := make(chan struct{})
	var once sync.Once
	host := testenv.StartProxy(t, reg.Host, testenv.ProxyHooks{Request: func(_ http.ResponseWriter, r *http.Request) bool {
		if r.Body != nil {
			r.Body = struct {
				io.Reader
				io.Closer
			}{&gatedReader{r: r.Body, sent: &sent, limit: &limit, reached: func() { once.Do(func() { close(reached) }) }, gate: gate}, r.Body}
		}
		return true
	}}).Host
	var openGate sync.Once
	release := func() { openGate.Do(func() { close(gate) }) }
	t.Cleanup(release) // registered after the proxy's close, so it runs first: a gated upload lets the proxy stop

	cmd := exec.Command(bin, "--home", home, "push", host+"/team/m:v1", "--from", "m:v1", "--plain-http", "-q")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-reached:
	case err := <-done:
		t.Fatalf("the push ended before the gate: %v\n%s", err, stderr.String())
	}
	cmd.Process.Signal(syscall.SIGINT)
	release()
	err := <-done
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
		t.Fatalf("after SIGINT: %v\n%s", err, stderr.String())
	}
	firstSent := sent.Load()

	limit.Store(1 << 40)
	sent.Store(0)
	if code, _, stderr := run("--home", home, "push", host+"/team/m:v1", "--from", "m:v1", "--plain-http", "-q"); code != 0 {
		t.Fatalf("run again: %s", stderr)
	}
	// Without resumption the second run sends the whole shard again.
	second := sent.Load()
	t.Logf("first run sent %d bytes before SIGINT, the second %d, the shard is %d", firstSent, second, shardSize)
	if second >= shardSize {
		t.Errorf("the second run sent %d bytes for a %d byte shard of which %d had been sent: it did not resume", second, shardSize, firstSent)
	}
	out := filepath.Join(t.TempDir(), "out")
	if code, _, stderr := run("fetch", "--plain-http", "-q", reg.Host+"/team/m:v1", out); code != 0 {
		t.Fatalf("fetch: %s", stderr)
	}
	shard := testmodel.ShardName(0, 1)
	want, _ := os.ReadFile(filepath.Join(model, shard))
	if got, _ := os.ReadFile(filepath.Join(out, shard)); !bytes.Equal(got, want) {
		t.Fatal("the pushed shard differs from the packed one")
	}
}
