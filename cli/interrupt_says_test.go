package cli

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// gatedBody passes the first n bytes of an upload and then holds the rest until the gate opens or the request
// ends: an upload that starts moving and then stalls.
type gatedBody struct {
	rc   io.ReadCloser
	n    int64
	gate <-chan struct{}
	done <-chan struct{}
}

func (b *gatedBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		select {
		case <-b.gate:
		case <-b.done:
			return 0, io.ErrUnexpectedEOF
		}
		return b.rc.Read(p)
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.rc.Read(p)
	b.n -= int64(n)
	return n, err
}

func (b *gatedBody) Close() error { return b.rc.Close() }

// interruptMidTransfer runs the real CLI with args, waits for a progress line of shard past 0%, sends SIGINT and
// returns what it printed after; the exit code must be 130.
func interruptMidTransfer(t *testing.T, env []string, shard string, args ...string) string {
	t.Helper()
	cmd := exec.Command(testenv.Modelpack(t), args...)
	cmd.Env = append(append(os.Environ(), "MODELPACK_PROGRESS_INTERVAL=20ms"), env...)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var seen bytes.Buffer
	sc := bufio.NewScanner(stderr)
	progress := false
	for !progress && sc.Scan() {
		line := sc.Text()
		seen.WriteString(line + "\n")
		progress = strings.Contains(line, shard) && strings.Contains(line, "%)") && !strings.Contains(line, "(0%)")
	}
	if !progress {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("no progress line for %s:\n%s", shard, seen.String())
	}
	cmd.Process.Signal(syscall.SIGINT)
	rest, _ := io.ReadAll(stderr)
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
		t.Fatalf("after SIGINT: %v, want exit 130\n%s%s", err, seen.String(), rest)
	}
	return string(rest)
}

// Ctrl-C during a pull or a push prints one line: interrupted, what is kept, and the command that resumes; run
// again, that command completes.
func TestInterruptSaysWhatIsKeptAndHowToResume(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	model := t.TempDir()
	if err := testmodel.Generate(model, testmodel.Spec{Shards: 1, ShardSize: 32 << 20, Seed: 9}); err != nil {
		t.Fatal(err)
	}
	shard := testmodel.ShardName(0, 1)
	bin := testenv.Modelpack(t)

	t.Run("pull", func(t *testing.T) {
		mustRemoteCLI(t, "pack", model, "-t", reg.Host+"/slow/pull:v1", "--push", "--plain-http", "-q")
		proxy := startStallingProxy(t, reg.Host, 4<<20)
		home := t.TempDir()
		ref := proxy.addr + "/slow/pull:v1"
		out := interruptMidTransfer(t, []string{"MODELPACK_HOME=" + home}, shard, "pull", "--plain-http", ref)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		last := lines[len(lines)-1]
		for _, want := range []string{"Error: interrupted: ", "stay in the local store (" + home, "partial download is kept", "run `modelpack pull " + ref + "` again"} {
			if !strings.Contains(last, want) {
				t.Fatalf("the last line lacks %q:\n%s", want, out)
			}
		}
		proxy.release()
		cmd := exec.Command(bin, "pull", "--plain-http", "-q", ref)
		cmd.Env = append(os.Environ(), "MODELPACK_HOME="+home)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("pull again: %v\n%s", err, b)
		}
	})

	t.Run("push", func(t *testing.T) {
		gate := make(chan struct{})
		var once sync.Once
		release := func() { once.Do(func() { close(gate) }) }
		t.Cleanup(release)
		proxy := testenv.StartProxy(t, reg.Host, testenv.ProxyHooks{Request: func(w http.ResponseWriter, r *http.Request) bool {
			if (r.Method == http.MethodPatch || r.Method == http.MethodPut) && r.ContentLength != 0 {
				r.Body = &gatedBody{rc: r.Body, n: 4 << 20, gate: gate, done: r.Context().Done()}
			}
			return true
		}})
		home := t.TempDir()
		ref := proxy.Host + "/slow/push:v1"
		env := []string{"MODELPACK_HOME=" + home}
		pack := exec.Command(bin, "pack", model, "-t", ref, "-q")
		pack.Env = append(os.Environ(), env...)
		if b, err := pack.CombinedOutput(); err != nil {
			t.Fatalf("pack: %v\n%s", err, b)
		}
		out := interruptMidTransfer(t, env, shard, "push", "--plain-http", ref)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		last := lines[len(lines)-1]
		for _, want := range []string{"Error: interrupted: ", "already holds are skipped", "resumes from the offset the registry kept", "run `modelpack push " + ref + "` again"} {
			if !strings.Contains(last, want) {
				t.Fatalf("the last line lacks %q:\n%s", want, out)
			}
		}
		release()
		cmd := exec.Command(bin, "push", "--plain-http", "-q", ref)
		cmd.Env = append(os.Environ(), env...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("push again: %v\n%s", err, b)
		}
	})
}
