//go:build fleet

package fleet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	digest "github.com/opencontainers/go-digest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/modelpack/modelpack/e2e/fleet/kraken"
	"github.com/modelpack/modelpack/internal/testenv"
)

// public is the registry name pods use; each node's hosts.toml says where that registry really is (the counting
// proxy) and, with the P2P layer on, names the node's Kraken agent as its mirror.
const public = "models.fleet.test"

// origin is the registry as the fleet sees it: a real distribution registry behind a proxy that counts the blob
// bytes it serves, by client (the nodes' drivers, or Kraken's origin), and can hold a blob mid-stream.
type origin struct {
	*testenv.Proxy
	reg *testenv.Registry

	mu     sync.Mutex
	served map[string]int64 // "driver"|"kraken" + " " + digest → blob bytes sent
	hold   *hold
}

// hold stops the stream of blob d to Kraken's origin once at bytes have gone, until release is closed.
type hold struct {
	d       digest.Digest
	at      int64
	reached chan struct{}
	release chan struct{}
	once    sync.Once
}

func startOrigin(t testing.TB) *origin {
	t.Helper()
	o := &origin{reg: testenv.StartRegistry(t, testenv.RegistryOptions{}), served: map[string]int64{}}
	o.Proxy = testenv.StartProxy(t, o.reg.Host, testenv.ProxyHooks{
		Request: func(_ http.ResponseWriter, r *http.Request) bool {
			// Kraken's origin asks for a manifest it reads as a blob without an Accept header, and distribution
			// then refuses an OCI manifest (404): the agent would answer 500 and cost each pull a fallback. This
			// adds the header it forgot (a two-line upstream fix: Accept in registrybackend's blobclient.go).
			if strings.Contains(r.URL.Path, "/manifests/") && r.Header.Get("Accept") == "" {
				r.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json")
			}
			return true
		},
		Response: func(resp *http.Response) {
			req := resp.Request
			if req.Method != http.MethodGet || !strings.Contains(req.URL.Path, "/blobs/") {
				return
			}
			who := "kraken"
			if strings.HasPrefix(req.Header.Get("User-Agent"), "modelpack") {
				who = "driver"
			}
			d := digest.Digest(req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:])
			resp.Body = &counted{rc: resp.Body, o: o, key: who + " " + d.String(), d: d, kraken: who == "kraken"}
		},
	})
	return o
}

// bytes is what the registry served of the given blobs to who ("driver", "kraken", or "" for both).
func (o *origin) bytes(who string, ds ...digest.Digest) int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var n int64
	for _, d := range ds {
		for _, w := range []string{"driver", "kraken"} {
			if who == "" || who == w {
				n += o.served[w+" "+d.String()]
			}
		}
	}
	return n
}

// holdAt makes the next stream of d to Kraken's origin stop after at bytes until the returned release is called.
func (o *origin) holdAt(d digest.Digest, at int64) (reached <-chan struct{}, release func()) {
	h := &hold{d: d, at: at, reached: make(chan struct{}), release: make(chan struct{})}
	o.mu.Lock()
	o.hold = h
	o.mu.Unlock()
	var once sync.Once
	return h.reached, func() { once.Do(func() { close(h.release) }) }
}

type counted struct {
	rc     io.ReadCloser
	o      *origin
	key    string
	d      digest.Digest
	kraken bool
	n      int64
}

func (c *counted) Read(b []byte) (int, error) {
	c.o.mu.Lock()
	h := c.o.hold
	c.o.mu.Unlock()
	if h != nil && c.kraken && h.d == c.d {
		if room := h.at - c.n; room <= 0 {
			h.once.Do(func() { close(h.reached) })
			<-h.release
		} else if int64(len(b)) > room {
			b = b[:room]
		}
	}
	n, err := c.rc.Read(b)
	c.n += int64(n)
	c.o.mu.Lock()
	c.o.served[c.key] += int64(n)
	c.o.mu.Unlock()
	return n, err
}

func (c *counted) Close() error { return c.rc.Close() }

// node is one simulated node: a `modelpack csi-driver` process with its own root and socket, reading the model
// registry through its hosts directory, and (with the P2P layer) its own Kraken agent.
type node struct {
	t      testing.TB
	name   string
	root   string
	sock   string
	log    string
	agent  *kraken.Agent
	cmd    *exec.Cmd
	done   chan struct{}
	client csi.NodeClient

	mu      sync.Mutex
	targets map[string]string // target → volume id, unpublished at test end
}

// startNodes starts one driver per agent (mirror: its agent), or n drivers straight to the registry (agents nil).
func startNodes(t testing.TB, dir string, o *origin, n int, agents []*kraken.Agent, tag string) []*node {
	t.Helper()
	var nodes []*node
	for i := range n {
		nd := &node{t: t, name: fmt.Sprintf("%s-node%d", tag, i+1), targets: map[string]string{}}
		if agents != nil {
			nd.agent = agents[i]
		}
		nd.start(t, filepath.Join(dir, nd.name), o)
		nodes = append(nodes, nd)
	}
	return nodes
}

func (nd *node) start(t testing.TB, root string, o *origin) {
	t.Helper()
	nd.root, nd.sock, nd.log = root, filepath.Join(root, "csi.sock"), filepath.Join(root, "driver.log")
	hosts := filepath.Join(root, "hosts.d", public)
	if err := os.MkdirAll(hosts, 0o755); err != nil {
		t.Fatal(err)
	}
	toml := fmt.Sprintf("server = %q\n", "http://"+o.Host)
	if nd.agent != nil {
		toml += fmt.Sprintf("\n[host.%q]\n  capabilities = [\"pull\"]\n", "http://"+nd.agent.Registry)
	}
	if err := os.WriteFile(filepath.Join(hosts, "hosts.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(nd.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	nd.cmd = exec.Command(testenv.Modelpack(t), "csi-driver", "--endpoint", "unix://"+nd.sock, "--node-id", nd.name,
		"--root", filepath.Join(root, "var"), "--metrics-addr", testenv.FreeAddr(t),
		"--registry-config", testenv.EmptyDockerConfig(t), "--hosts-dir", filepath.Dir(hosts),
		"--log-format", "text", "--log-level", "debug")
	nd.cmd.Stdout, nd.cmd.Stderr = logf, logf
	nd.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // the test binary dying without cleanups
	if err := nd.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	nd.done = make(chan struct{})
	go func() { nd.cmd.Wait(); close(nd.done) }()
	conn, err := grpc.NewClient("unix://"+nd.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	nd.client = csi.NewNodeClient(conn)
	t.Cleanup(func() {
		nd.unpublishAll()
		conn.Close()
		nd.stop()
		if t.Failed() {
			b, _ := os.ReadFile(nd.log)
			t.Logf("%s driver log:\n%s", nd.name, b)
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
		cancel()
		if err == nil && resp.GetReady().GetValue() {
			return
		}
		select {
		case <-nd.done:
			b, _ := os.ReadFile(nd.log)
			t.Fatalf("%s: driver exited at start:\n%s", nd.name, b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: driver not ready after 30s", nd.name)
		}
	}
}

// stop is SIGTERM to the driver's PID, SIGKILL if it has not exited within 20 s.
func (nd *node) stop() {
	select {
	case <-nd.done:
		return
	default:
	}
	nd.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-nd.done:
	case <-time.After(20 * time.Second):
		nd.cmd.Process.Kill()
		<-nd.done
	}
}

// publish mounts the model ref (a path under the public registry) for a new pod, as kubelet does, and returns
// the target.
func (nd *node) publish(ref, pod string) (string, error) {
	parent := filepath.Join(nd.root, "kubelet", "pods", pod, "volumes", "kubernetes.io~csi", "model")
	if err := os.MkdirAll(parent, 0o750); err != nil {
		return "", err
	}
	target := filepath.Join(parent, "mount")
	vol := "vol-" + pod
	nd.mu.Lock()
	nd.targets[target] = vol
	nd.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, err := nd.client.NodePublishVolume(ctx, testenv.PublishRequest(vol, target, map[string]string{"reference": public + "/" + ref}))
	return target, err
}

func (nd *node) unpublishAll() {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	for target, vol := range nd.targets {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := nd.client.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: target}); err != nil {
			nd.t.Errorf("%s: unpublish %s: %v", nd.name, target, err)
		}
		cancel()
	}
	nd.targets = map[string]string{}
}

// publishAll publishes ref on every node at once, as N pods scheduled together, and returns the targets in node
// order and the time until the last publish returned; a failed publish ends the test.
func publishAll(t testing.TB, nodes []*node, ref, pod string) ([]string, time.Duration) {
	t.Helper()
	targets, took := publishAllErr(t, nodes, ref, pod)
	if t.Failed() {
		t.FailNow()
	}
	return targets, took
}

// publishAllErr is publishAll for a goroutine: a failed publish is an error of the test, not a FailNow.
func publishAllErr(t testing.TB, nodes []*node, ref, pod string) ([]string, time.Duration) {
	targets, errs := make([]string, len(nodes)), make([]error, len(nodes))
	start := time.Now()
	var wg sync.WaitGroup
	for i, nd := range nodes {
		wg.Go(func() { targets[i], errs[i] = nd.publish(ref, pod) })
	}
	wg.Wait()
	took := time.Since(start)
	for i, err := range errs {
		if err != nil {
			t.Errorf("%s: publish %s: %v", nodes[i].name, ref, err)
		}
	}
	return targets, took
}
