// Package kraken runs Uber Kraken (tracker, origin, build-index and one agent per node) as child processes on
// loopback in front of a registry, for the fleet tests: each simulated node gets an agent of its own, on ports of
// its own, to name as its registry mirror in hosts.toml. The binaries are e2e/fleet/build.sh's (bin/kraken);
// nginx is Debian's. Every process is stopped by its process group (a component and the nginx it forks) and every
// file Kraken writes outside the test's directory is removed at test end, also when the test fails.
package kraken

import (
	"embed"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/internal/testenv"
)

//go:embed config
var configs embed.FS

// nginxGenDir is where Kraken writes each component's nginx config, as /tmp/nginx/<nginx.name> (hard-coded).
const nginxGenDir = "/tmp/nginx"

// Fleet is a running Kraken: the cluster-wide parts and one agent per node.
type Fleet struct {
	Origin, Tracker, BuildIndex *Proc
	Agents                      []*Agent
	name                        string
	bin                         string
}

// Agent is one node's Kraken agent.
type Agent struct {
	*Proc
	// Registry is the host:port of its registry API (nginx, admits 127.0.0.1 only): the node's mirror.
	Registry string
	// Server is the host:port of its agent server: health and an unauthenticated admin API.
	Server string
}

// Proc is a Kraken component (and the nginx it forks) in a process group of its own.
type Proc struct {
	Name string
	Dir  string // its configuration, state and logs
	cmd  *exec.Cmd
	done chan struct{}
}

// Bin is the directory of Kraken's binaries, or the test stops (skipped locally, failed under CI=true).
func Bin(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(testenv.RepoRoot(), "bin", "kraken")
	for _, b := range []string{"agent", "origin", "tracker", "build-index"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			testenv.Unavailable(t, "%s not built: run `bash e2e/fleet/build.sh` (make e2e-fleet does)", filepath.Join(bin, b))
		}
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err != nil {
		testenv.Unavailable(t, "nginx not installed: run `bash e2e/fleet/build.sh`")
	}
	return bin
}

// Start starts a tracker, an origin reading blobs from registry (a plain-HTTP host:port), a build-index and n
// agents, and waits until each answers its health check.
func Start(t testing.TB, registry string, n int) *Fleet {
	t.Helper()
	testenv.RequireRoot(t) // Kraken's nginx template runs nginx as root
	f := &Fleet{bin: Bin(t), name: fmt.Sprintf("modelpack-fleet-%d", os.Getpid())}
	dir := t.TempDir()
	port := func() string { a := testenv.FreeAddr(t); return a[strings.LastIndex(a, ":")+1:] }
	trackerPort, originPort, buildIndexPort := port(), port(), port()
	vars := []string{
		"@REGISTRY@", registry,
		"@TRACKER@", "127.0.0.1:" + trackerPort,
		"@ORIGIN@", "127.0.0.1:" + originPort,
		"@BUILDINDEX@", "127.0.0.1:" + buildIndexPort,
	}
	f.Tracker = f.start(t, dir, "tracker", vars, "--port="+trackerPort)
	f.Origin = f.start(t, dir, "origin", vars, "--blobserver-hostname=127.0.0.1", "--blobserver-port="+originPort,
		"--peer-ip=127.0.0.1", "--peer-port="+port())
	f.BuildIndex = f.start(t, dir, "build-index", vars, "--port="+buildIndexPort)
	f.Tracker.waitHealthy(t, "127.0.0.1:"+trackerPort)
	f.Origin.waitHealthy(t, "127.0.0.1:"+originPort)
	f.BuildIndex.waitHealthy(t, "127.0.0.1:"+buildIndexPort)
	for i := range n {
		reg, srv := port(), port()
		a := &Agent{Registry: "127.0.0.1:" + reg, Server: "127.0.0.1:" + srv}
		// Every agent is on 127.0.0.1: its peer id (addr_hash) differs by its peer port.
		a.Proc = f.start(t, dir, "agent", vars, "--peer-ip=127.0.0.1", "--peer-port="+port(),
			"--agent-server-port="+srv, "--agent-registry-port="+reg)
		a.Name = fmt.Sprintf("agent%d", i+1)
		f.Agents = append(f.Agents, a)
	}
	for _, a := range f.Agents {
		a.waitHealthy(t, a.Registry)
	}
	return f
}

// start renders component's configuration into its own directory and starts it in a process group of its own,
// stopped at test end.
func (f *Fleet) start(t testing.TB, dir, component string, vars []string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: component, Dir: filepath.Join(dir, component)}
	for i := 2; ; i++ { // several agents: agent, agent-2, …
		if _, err := os.Stat(p.Dir); os.IsNotExist(err) {
			break
		}
		p.Dir = filepath.Join(dir, component+"-"+strconv.Itoa(i))
	}
	if err := os.MkdirAll(p.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	name := f.name + "-" + filepath.Base(p.Dir)
	r := strings.NewReplacer(append(vars, "@DIR@", p.Dir, "@NAME@-"+component, name)...)
	for _, file := range []string{component + ".yaml", component + "-nginx.tmpl"} {
		b, err := configs.ReadFile("config/" + file)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(file, ".yaml") {
			b = []byte(r.Replace(string(b)))
			file = "config.yaml"
		}
		if err := os.WriteFile(filepath.Join(p.Dir, file), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	log, err := os.Create(filepath.Join(p.Dir, "stdout.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	p.cmd = exec.Command(filepath.Join(f.bin, component), append([]string{"--config=" + filepath.Join(p.Dir, "config.yaml")}, args...)...)
	p.cmd.Dir = p.Dir
	p.cmd.Stdout, p.cmd.Stderr = log, log
	// A group of its own: the component forks nginx, which would outlive it and keep its port. Pdeathsig ends the
	// component if the test binary dies without its cleanups (go test's timeout); its nginx then stays behind.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.done = make(chan struct{})
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Kill()
		os.Remove(filepath.Join(nginxGenDir, name))
		os.Remove(nginxGenDir) // only if empty: another fleet's configs stay
		removeStalePid()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(p.Dir, "stdout.log"))
			t.Logf("%s log (tail):\n%s", p.Dir, tail(b, 40))
		}
	})
	return p
}

// Pgid is the component's process group: it and the nginx it forks.
func (p *Proc) Pgid() int { return p.cmd.Process.Pid }

// Kill ends the component and its nginx at once (SIGKILL to the process group): a node's agent dying. It returns
// once no process of the group is left alive.
func (p *Proc) Kill() {
	pgid := p.cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
	// nginx, reparented when the component died, may outlive it by a moment. Its exit is read from /proc, not with
	// kill(-pgid, 0), which also counts zombies that init has not reaped yet.
	for deadline := time.Now().Add(10 * time.Second); groupAlive(pgid) && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

// nginxPid is the pid file Kraken's base nginx template hard-codes for every component: the last nginx to start
// wrote it, and one killed leaves it behind. Nothing reads it.
const nginxPid = "/tmp/nginx.pid"

// removeStalePid removes nginxPid when the process it names is gone (another fleet's nginx may own it).
func removeStalePid() {
	b, err := os.ReadFile(nginxPid)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err == nil && pid > 0 && alive(pid) {
		return
	}
	os.Remove(nginxPid)
}

// alive reports whether process pid exists and is no zombie.
func alive(pid int) bool {
	f := ProcStat(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// ProcStat returns the fields of a /proc/PID/stat file after the command name (state, ppid, pgrp, …), or nil.
func ProcStat(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	// comm may hold spaces and parentheses: the fields start after the last ')'.
	return strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
}

// groupAlive reports whether a process of group pgid is alive (neither exited nor a zombie).
func groupAlive(pgid int) bool {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, st := range stats {
		if f := ProcStat(st); len(f) > 2 && f[2] == strconv.Itoa(pgid) && f[0] != "Z" && f[0] != "X" {
			return true
		}
	}
	return false
}

func (p *Proc) waitHealthy(t testing.TB, addr string) {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := c.Get("http://" + addr + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-p.done:
			b, _ := os.ReadFile(filepath.Join(p.Dir, "stdout.log"))
			t.Fatalf("%s exited at start:\n%s", p.Dir, tail(b, 40))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not healthy on %s after 60s", p.Dir, addr)
		}
	}
}

// CachedBlob is the file in which the agent keeps blob d once it holds it (Kraken does not re-verify it).
func (a *Agent) CachedBlob(d digest.Digest) string {
	h := d.Encoded()
	return filepath.Join(a.Dir, "cache", h[:2], h[2:4], h, "data")
}

// Downloading reports whether the agent has begun downloading blob d from its peers or the origin.
func (a *Agent) Downloading(d digest.Digest) bool {
	h := d.Encoded()
	_, err := os.Stat(filepath.Join(a.Dir, "download", h[:2], h[2:4], h, "data"))
	return err == nil
}

func tail(b []byte, lines int) string {
	s := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(s) > lines {
		s = s[len(s)-lines:]
	}
	return strings.Join(s, "\n")
}
