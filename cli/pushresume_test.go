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

// gatedProxy is a registry's front that counts request-body bytes (uploads) and, while armed, holds the upload
// once limit bytes have passed, telling reached. A session's location names the registry as the push reached it,
// so both runs of a resume test go through the same proxy.
type gatedProxy struct {
	host    string
	sent    atomic.Int64
	limit   atomic.Int64
	reached chan struct{}
	release func()
}

func startGatedProxy(t *testing.T, registryHost string, limit int64) *gatedProxy {
	p := &gatedProxy{reached: make(chan struct{})}
	p.limit.Store(limit)
	gate := make(chan struct{})
	var once, openGate sync.Once
	p.host = testenv.StartProxy(t, registryHost, testenv.ProxyHooks{Request: func(_ http.ResponseWriter, r *http.Request) bool {
		if r.Body != nil {
			r.Body = struct {
				io.Reader
				io.Closer
			}{&gatedReader{r: r.Body, sent: &p.sent, limit: &p.limit, reached: func() { once.Do(func() { close(p.reached) }) }, gate: gate}, r.Body}
		}
		return true
	}}).Host
	p.release = func() { openGate.Do(func() { close(gate) }) }
	t.Cleanup(p.release) // registered after the proxy's close, so it runs first: a gated upload lets the proxy stop
	return p
}

// interruptThenResume runs bin with args through p until the upload passes p's limit, interrupts it (SIGINT, exit
// 130), then runs it again to completion. It returns the bytes each run sent.
func interruptThenResume(t *testing.T, p *gatedProxy, bin string, args ...string) (first, second int64) {
	cmd := exec.Command(bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-p.reached:
	case err := <-done:
		t.Fatalf("%s ended before the gate: %v\n%s", args, err, stderr.String())
	}
	cmd.Process.Signal(syscall.SIGINT)
	p.release()
	err := <-done
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
		t.Fatalf("%s after SIGINT: %v\n%s", args, err, stderr.String())
	}
	first = p.sent.Load()
	p.limit.Store(1 << 40)
	p.sent.Store(0)
	again := exec.Command(bin, args...)
	if b, err := again.CombinedOutput(); err != nil {
		t.Fatalf("%s run again: %v\n%s", args, err, b)
	}
	return first, p.sent.Load()
}

// resumeModel packs a model of one 32 MiB shard into home's store.
func resumeModel(t *testing.T, home string) (model string) {
	model = t.TempDir()
	if err := testmodel.Generate(model, testmodel.Spec{Shards: 1, ShardSize: resumeShard, Seed: 21}); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := binaryRunner(t)("--home", home, "pack", model, "-t", "m:v1", "-q"); code != 0 {
		t.Fatalf("pack: %s", stderr)
	}
	return model
}

const resumeShard = 32 << 20

// checkResumed fails unless the second run sent less than the shard (it resumed) and ref holds the model's shard.
func checkResumed(t *testing.T, what string, first, second int64, ref, model string) {
	t.Helper()
	// Without resumption the second run sends the whole shard again.
	t.Logf("%s: first run sent %d bytes before SIGINT, the second %d, the shard is %d", what, first, second, resumeShard)
	if second >= resumeShard {
		t.Errorf("%s: the second run sent %d bytes for a %d byte shard of which %d had been sent: it did not resume", what, second, resumeShard, first)
	}
	out := filepath.Join(t.TempDir(), "out")
	if code, _, stderr := binaryRunner(t)("fetch", "--plain-http", "-q", ref, out); code != 0 {
		t.Fatalf("fetch: %s", stderr)
	}
	shard := testmodel.ShardName(0, 1)
	want, _ := os.ReadFile(filepath.Join(model, shard))
	if got, _ := os.ReadFile(filepath.Join(out, shard)); !bytes.Equal(got, want) {
		t.Fatalf("%s: the pushed shard differs from the packed one", what)
	}
}

// Item: a push interrupted part way through a large blob (SIGINT) resumes on the next run from the bytes the
// registry's upload session holds (GET on the remembered upload location, Range header) instead of sending the
// whole blob again.
func TestInterruptedPushResumes(t *testing.T) {
	bin := testenv.Modelpack(t)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	home := t.TempDir()
	model := resumeModel(t, home)
	p := startGatedProxy(t, reg.Host, 12<<20)
	first, second := interruptThenResume(t, p, bin, "--home", home, "push", p.host+"/team/m:v1", "--from", "m:v1", "--plain-http", "-q")
	checkResumed(t, "push", first, second, reg.Host+"/team/m:v1", model)
}

// Item: pack --push resumes the same way: the second run hashes the shard again but sends only what the upload
// session lacks.
func TestInterruptedPackPushResumes(t *testing.T) {
	bin := testenv.Modelpack(t)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	home := t.TempDir()
	model := t.TempDir()
	if err := testmodel.Generate(model, testmodel.Spec{Shards: 1, ShardSize: resumeShard, Seed: 21}); err != nil {
		t.Fatal(err)
	}
	p := startGatedProxy(t, reg.Host, 12<<20)
	first, second := interruptThenResume(t, p, bin, "--home", home, "pack", model, "-t", p.host+"/team/m:v1", "--push", "--plain-http", "-q")
	checkResumed(t, "pack --push", first, second, reg.Host+"/team/m:v1", model)
}

// Item: copy between two registries resumes the same way: the destination's session is kept in the local store,
// and the second run reads the source from the byte the session holds.
func TestInterruptedCopyResumes(t *testing.T) {
	bin := testenv.Modelpack(t)
	src := testenv.StartRegistry(t, testenv.RegistryOptions{})
	dst := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	home := t.TempDir()
	model := resumeModel(t, home)
	if code, _, stderr := binaryRunner(t)("--home", home, "push", src.Host+"/team/m:v1", "--from", "m:v1", "--plain-http", "-q"); code != 0 {
		t.Fatalf("push: %s", stderr)
	}
	p := startGatedProxy(t, dst.Host, 12<<20)
	first, second := interruptThenResume(t, p, bin, "--home", home, "copy", src.Host+"/team/m:v1", p.host+"/mirror/m:v1", "--plain-http", "-q")
	checkResumed(t, "copy", first, second, dst.Host+"/mirror/m:v1", model)
}
