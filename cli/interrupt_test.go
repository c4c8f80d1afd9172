package cli

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// stallingProxy forwards TCP to a registry and, once limit bytes have come back from it, holds every further
// byte until release is called: a blob that starts moving and then stalls, as on a slow link.
type stallingProxy struct {
	addr    string
	sent    atomic.Int64
	limit   int64
	gate    chan struct{}
	release func()
}

func startStallingProxy(t *testing.T, upstream string, limit int64) *stallingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallingProxy{addr: ln.Addr().String(), limit: limit, gate: make(chan struct{})}
	var once sync.Once
	p.release = func() { once.Do(func() { close(p.gate) }) }
	var conns sync.WaitGroup
	t.Cleanup(func() { p.release(); ln.Close(); conns.Wait() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			conns.Add(2)
			go func() { defer conns.Done(); io.Copy(u, c); u.Close() }()
			go func() {
				defer conns.Done()
				defer c.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := u.Read(buf)
					if n > 0 {
						if p.sent.Add(int64(n)) > p.limit {
							<-p.gate
						}
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

// Item: piped output says when each blob starts and how a long one is doing; SIGINT and SIGTERM say
// "interrupted: what arrived is kept in DIR/.modelpack-partial; run … again", and running again completes.
func TestPipedProgressAndInterrupt(t *testing.T) {
	bin := testenv.Modelpack(t)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	model := t.TempDir()
	if err := testmodel.Generate(model, testmodel.Spec{Shards: 1, ShardSize: 32 << 20, Seed: 8}); err != nil {
		t.Fatal(err)
	}
	mustRemoteCLI(t, "pack", model, "-t", reg.Host+"/slow/model:v1", "--push", "--plain-http", "-q")
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			proxy := startStallingProxy(t, reg.Host, 4<<20)
			ref := proxy.addr + "/slow/model:v1"
			dir := filepath.Join(t.TempDir(), "out")
			cmd := exec.Command(bin, "fetch", "--plain-http", ref, dir)
			cmd.Env = append(os.Environ(), "MODELPACK_PROGRESS_INTERVAL=20ms")
			stderr, _ := cmd.StderrPipe() // a pipe, as in CI
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var seen bytes.Buffer
			sc := bufio.NewScanner(stderr)
			shard := testmodel.ShardName(0, 1)
			started, progress := false, false
			for !progress && sc.Scan() {
				line := sc.Text()
				seen.WriteString(line + "\n")
				started = started || (strings.HasPrefix(line, "fetching") && strings.Contains(line, shard) && !strings.Contains(line, "%"))
				// Interrupted once the shard has bytes on disk, which the next run must not ask for again.
				progress = started && strings.Contains(line, shard) && strings.Contains(line, "%)") && !strings.Contains(line, "(0%)")
			}
			if !progress {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("no start line and progress line for the stalled blob:\n%s", seen.String())
			}
			cmd.Process.Signal(sig)
			rest, _ := io.ReadAll(stderr)
			err := cmd.Wait()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 || !strings.Contains(string(rest), "interrupted: what arrived is kept in "+filepath.Join(dir, ".modelpack-partial")) {
				t.Fatalf("after %v: %v\n%s%s", sig, err, seen.String(), rest)
			}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				// The partial shard stays aside, for the next run to resume; nothing under a final name.
				if e.Name() == shard || (strings.HasPrefix(e.Name(), ".modelpack") && e.Name() != ".modelpack-partial") {
					t.Errorf("after %v, %s was left in the directory", sig, e.Name())
				}
			}
			proxy.release()
			// Run again through a counting proxy that does not stall: only what the first run lacked comes.
			again := startStallingProxy(t, reg.Host, 1<<40)
			if out, err := exec.Command(bin, "fetch", "--plain-http", "-q", again.addr+"/slow/model:v1", dir).CombinedOutput(); err != nil {
				t.Fatalf("run again: %v\n%s", err, out)
			}
			want, _ := os.ReadFile(filepath.Join(model, shard))
			if got, _ := os.ReadFile(filepath.Join(dir, shard)); !bytes.Equal(got, want) {
				t.Fatal("the shard differs after the second run")
			}
			// Without resumption the second run receives the whole shard again, and more.
			if sent := again.sent.Load(); sent >= int64(len(want)) {
				t.Errorf("the second run received %d bytes for a %d byte shard part of which had arrived: it did not resume", sent, len(want))
			}
			if _, err := os.Stat(filepath.Join(dir, ".modelpack-partial")); err == nil {
				t.Error("the partial directory stayed after the fetch completed")
			}
		})
	}
}
