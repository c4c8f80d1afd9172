package e2e

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	digest "github.com/opencontainers/go-digest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/modelpack/modelpack/internal/testenv"
)

// drvModel is a small ModelPack artifact: file path → content. Kinds follow the file names.
type drvModel map[string][]byte

// drvProxy sits between the driver and the registry: it counts requests and can throttle blob downloads.
type drvProxy struct {
	*testenv.Proxy
	// rate is the blob download rate in bytes per second; 0 means unthrottled.
	rate atomic.Int64

	mu        sync.Mutex
	blobGets  map[string]int   // digest → GETs
	blobBytes map[string]int64 // digest → bytes sent
	manifests int              // GET or HEAD of manifests
}

func drvStartProxy(t *testing.T, registryHost string) *drvProxy {
	t.Helper()
	p := &drvProxy{blobGets: map[string]int{}, blobBytes: map[string]int64{}}
	p.Proxy = testenv.StartProxy(t, registryHost, testenv.ProxyHooks{
		Request: func(_ http.ResponseWriter, r *http.Request) bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			switch {
			case strings.Contains(r.URL.Path, "/blobs/") && r.Method == http.MethodGet:
				p.blobGets[r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]]++
			case strings.Contains(r.URL.Path, "/manifests/"):
				p.manifests++
			}
			return true
		},
		Response: func(resp *http.Response) {
			if strings.Contains(resp.Request.URL.Path, "/blobs/") && resp.Request.Method == http.MethodGet {
				path := resp.Request.URL.Path
				resp.Body = &throttled{rc: resp.Body, p: p, digest: path[strings.LastIndex(path, "/")+1:]}
			}
		},
	})
	return p
}

func (p *drvProxy) blobGetsOf(d digest.Digest) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blobGets[d.String()]
}

func (p *drvProxy) blobBytesOf(d digest.Digest) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blobBytes[d.String()]
}

func (p *drvProxy) manifestRequests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.manifests
}

// throttled counts a blob's bytes and paces them to the proxy's rate.
type throttled struct {
	rc     io.ReadCloser
	p      *drvProxy
	digest string
}

func (r *throttled) Read(b []byte) (int, error) {
	n, err := r.rc.Read(b)
	r.p.mu.Lock()
	r.p.blobBytes[r.digest] += int64(n)
	r.p.mu.Unlock()
	if rate := r.p.rate.Load(); rate > 0 && n > 0 {
		time.Sleep(time.Duration(int64(n) * int64(time.Second) / rate))
	}
	return n, err
}

func (r *throttled) Close() error { return r.rc.Close() }

// drvProc is `modelpack csi-driver` running as a child process, as on a node.
type drvProc struct {
	t       *testing.T
	Root    string
	Sock    string
	Metrics string
	args    []string
	cmd     *exec.Cmd
	done    chan struct{}
	log     string
	// umask, if set, is the driver's umask (as a DaemonSet's container may have it), set by a shell before exec.
	umask string
}

func drvStart(t *testing.T, root string, plainHTTP ...string) *drvProc {
	t.Helper()
	return drvStartWith(t, root, nil, plainHTTP...)
}

// drvStartWith starts the driver with extra flags.
func drvStartWith(t *testing.T, root string, extra []string, plainHTTP ...string) *drvProc {
	t.Helper()
	return drvStartUmask(t, root, "", extra, plainHTTP...)
}

// drvStartUmask starts the driver under umask (as given to sh's umask; "" leaves the test's).
func drvStartUmask(t *testing.T, root, umask string, extra []string, plainHTTP ...string) *drvProc {
	t.Helper()
	testenv.RequireRoot(t)
	bin := testenv.Modelpack(t)
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	dockerCfg := testenv.EmptyDockerConfig(t)
	p := &drvProc{t: t, Root: root, Sock: filepath.Join(root, "csi.sock"), Metrics: testenv.FreeAddr(t),
		log: filepath.Join(root, "driver.log")}
	p.args = []string{"csi-driver", "--endpoint", "unix://" + p.Sock, "--node-id", "e2e-node", "--root", root,
		"--metrics-addr", p.Metrics, "--registry-config", dockerCfg, "--log-format", "text", "--log-level", "debug",
		"--plain-http-registries", strings.Join(plainHTTP, ",")}
	p.args = append(p.args, extra...)
	p.cmd = nil
	p.umask = umask
	p.start(bin)
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("driver log:\n%s", b)
		}
	})
	return p
}

func (p *drvProc) start(bin string) {
	p.t.Helper()
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	p.cmd = exec.Command(bin, p.args...)
	if p.umask != "" {
		p.cmd = exec.Command("/bin/sh", append([]string{"-c", `umask ` + p.umask + ` && exec "$0" "$@"`, bin}, p.args...)...)
	}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	logf.Close()
	p.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(p.cmd, p.done)
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := grpc.NewClient("unix://"+p.Sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			resp, perr := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
			cancel()
			conn.Close()
			if perr == nil && resp.GetReady().GetValue() {
				return
			}
		}
		select {
		case <-p.done:
			b, _ := os.ReadFile(p.log)
			p.t.Fatalf("driver exited at start:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatal("driver not ready after 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// restart starts the driver again on the same root, as the DaemonSet would after a crash.
func (p *drvProc) restart() { p.t.Helper(); p.start(testenv.Modelpack(p.t)) }

// kill is SIGKILL: no cleanup of any kind runs in the driver.
func (p *drvProc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *drvProc) stop() {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *drvProc) node() csi.NodeClient { return csi.NewNodeClient(p.conn()) }

// conn is a client connection to the driver's socket, closed at the end of the test.
func (p *drvProc) conn() *grpc.ClientConn {
	conn, err := grpc.NewClient("unix://"+p.Sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { conn.Close() })
	return conn
}

// metric returns the sum of the series of a metric whose labels contain every given label pair.
func (p *drvProc) metric(name string, labels ...string) float64 {
	p.t.Helper()
	resp, err := http.Get("http://" + p.Metrics + "/metrics")
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// drvKubelet makes the directories kubelet makes for a pod's CSI volume and returns the target path.
func drvKubelet(t *testing.T, root, pod string) string {
	t.Helper()
	parent := filepath.Join(root, "kubelet", "pods", pod, "volumes", "kubernetes.io~csi", "model")
	if err := os.MkdirAll(parent, 0o750); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(parent, "mount")
}

// drvPublish calls NodePublishVolume with the given deadline.
func drvPublish(node csi.NodeClient, req *csi.NodePublishVolumeRequest, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err := node.NodePublishVolume(ctx, req)
	return err
}

func drvUnpublish(t *testing.T, node csi.NodeClient, volID, target string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: volID, TargetPath: target}); err != nil {
		t.Fatalf("unpublish %s: %v", target, err)
	}
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("target %s still there after unpublish: %v", target, err)
	}
}

func drvWantCode(t *testing.T, err error, code codes.Code, contains string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), contains) {
		t.Fatalf("got %v, want %v with %q in the message", err, code, contains)
	}
}

func drvRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// drvSmallDisk mounts a tmpfs of size ("6m") at dir/node, a node's cache disk for a test that fills it, and returns
// its path; it is unmounted at cleanup unless the test did so.
func drvSmallDisk(t *testing.T, dir, size string) string {
	t.Helper()
	root := filepath.Join(dir, "node")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	// mode: a tmpfs root is 1777 by default, a shared directory no socket may live in.
	if err := syscall.Mount("tmpfs", root, "tmpfs", 0, "size="+size+",mode=0755"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(root, syscall.MNT_DETACH) })
	return root
}

// drvCleanupMounts fails the test if it leaves anything mounted below dir.
func drvCleanupMounts(t *testing.T, dir string) { testenv.NoMountsLeftUnder(t, dir) }

// drvMountOptions returns the per-mount options of a mount point from mountinfo.
func drvMountOptions(t *testing.T, target string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == target {
			return f[5]
		}
	}
	t.Fatalf("%s is not a mount point", target)
	return ""
}

func digestOf(b []byte) digest.Digest { return digest.FromBytes(b) }
