// Package harness is the Go side of the local Kubernetes cluster that e2e/cluster/up.sh starts: it connects a
// test to that cluster and gives it the few verbs a real-cluster test needs — apply manifests (deleted again at
// test end), wait for pods, read their logs and events, push models to the cluster's registry and count the
// blob GETs that registry served. It drives the real kubectl, so what a test does is what a user would type.
//
// Tests using it carry the build tag `cluster` (plain `go test ./...` needs no cluster) and run through
// `make e2e-cluster`, which starts the cluster, runs them and tears it down.
package harness

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Namespace of the driver as deploy/ installs it.
const Namespace = "modelpack"

// Cluster is a running local cluster, as described by its state directory.
type Cluster struct {
	Dir        string // state directory ($MODELPACK_CLUSTER_DIR, default /tmp/modelpack-cluster)
	Kubeconfig string
	Registry   string // host:port of the cluster's plain-HTTP registry
	Node       string // the node test pods run on (the single node; the first of Nodes)
	// Nodes and NodeIPs: every worker node, from the state directory's nodes.txt (the multi-node cluster,
	// e2e/fleet/cluster), else the single node.
	Nodes     []string
	NodeIPs   map[string]string
	Busybox   string // a busybox image in Registry for test pods
	Tesseract string // Debian's tesseract OCR program, without a model, as an image in Registry
	Modelpack string // the modelpack binary the driver image was built from
	// Poll is the time between two polls of the Wait helpers (default 250 ms). Each poll runs a kubectl, which
	// on two cores takes CPU from what a benchmark measures.
	Poll    time.Duration
	kubectl string
}

func (c *Cluster) poll() {
	if c.Poll > 0 {
		time.Sleep(c.Poll)
	} else {
		time.Sleep(250 * time.Millisecond)
	}
}

// Connect returns the running cluster, or stops the test (a failure under CI=true) when none is up.
func Connect(t testing.TB) *Cluster {
	t.Helper()
	dir := os.Getenv("MODELPACK_CLUSTER_DIR")
	if dir == "" {
		dir = "/tmp/modelpack-cluster"
	}
	root := testenv.RepoRoot()
	c := &Cluster{
		Dir:        dir,
		Kubeconfig: filepath.Join(dir, "pki", "admin.kubeconfig"),
		Registry:   "127.0.0.1:25000",
		Node:       "localhost",
		Modelpack:  filepath.Join(dir, "images", "modelpack"),
		kubectl:    filepath.Join(root, "bin", "k8s", "kubectl"),
	}
	if _, err := os.Stat(c.kubectl); err != nil {
		testenv.Unavailable(t, "kubectl not built: run `make cluster-up` (e2e/cluster/build.sh)")
	}
	if _, err := c.Run("get", "--raw", "/readyz"); err != nil {
		testenv.Unavailable(t, "no local cluster at %s: run `make cluster-up` or `make e2e-cluster` (%v)", dir, err)
	}
	// The multi-node cluster names its registry and nodes in its state directory.
	if b, err := os.ReadFile(filepath.Join(dir, "registry.addr")); err == nil {
		c.Registry = strings.TrimSpace(string(b))
	}
	c.Nodes, c.NodeIPs = []string{c.Node}, map[string]string{c.Node: "127.0.0.1"}
	if b, err := os.ReadFile(filepath.Join(dir, "nodes.txt")); err == nil {
		c.Nodes, c.NodeIPs = nil, map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			name, ip, _ := strings.Cut(line, " ")
			c.Nodes = append(c.Nodes, name)
			c.NodeIPs[name] = ip
		}
		c.Node = c.Nodes[0]
	}
	ref, err := os.ReadFile(filepath.Join(dir, "images", "busybox.ref"))
	if err != nil {
		t.Fatalf("cluster state incomplete: %v", err)
	}
	c.Busybox = strings.TrimSpace(string(ref))
	if ref, err = os.ReadFile(filepath.Join(dir, "images", "tesseract.ref")); err != nil {
		t.Fatalf("cluster state incomplete: %v", err)
	}
	c.Tesseract = strings.TrimSpace(string(ref))
	return c
}

// Run runs kubectl against the cluster and returns its stdout; the error carries stderr.
func (c *Cluster) Run(args ...string) (string, error) {
	return c.RunInput("", args...)
}

// RunInput is Run with stdin.
func (c *Cluster) RunInput(stdin string, args ...string) (string, error) {
	cmd := exec.Command(c.kubectl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// Kubectl runs kubectl and fails the test if it fails.
func (c *Cluster) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := c.Run(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Apply applies manifest and deletes its objects when the test ends (waiting until they are gone, so the next
// test starts from a node without them).
func (c *Cluster) Apply(t testing.TB, manifest string) {
	t.Helper()
	if _, err := c.RunInput(manifest, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := c.RunInput(manifest, "delete", "--ignore-not-found", "--wait=true", "--timeout=120s", "-f", "-"); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}

// Delete deletes one object and waits until it is gone.
func (c *Cluster) Delete(t testing.TB, namespace, kindName string) {
	t.Helper()
	c.Kubectl(t, "-n", namespace, "delete", kindName, "--wait=true", "--timeout=120s")
}

// Pod returns the pod's current state.
func (c *Cluster) Pod(t testing.TB, namespace, name string) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	c.getJSON(t, &p, "-n", namespace, "get", "pod", name)
	return &p
}

// WaitPod polls the pod until done reports true, and fails the test after timeout with the pod's state and
// events. done sees nil while the pod does not exist.
func (c *Cluster) WaitPod(t testing.TB, namespace, name string, timeout time.Duration, what string, done func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var p *corev1.Pod
		out, err := c.Run("-n", namespace, "get", "pod", name, "-o", "json", "--ignore-not-found")
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(out) != "" {
			p = new(corev1.Pod)
			if err := json.Unmarshal([]byte(out), p); err != nil {
				t.Fatal(err)
			}
		}
		if done(p) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s: not %s after %s\n%s", namespace, name, what, timeout, c.Describe(namespace, name))
		}
		c.poll()
	}
}

// WaitPhase waits for the pod to reach phase (Running, Succeeded, Failed); reaching another terminal phase fails.
func (c *Cluster) WaitPhase(t testing.TB, namespace, name string, phase corev1.PodPhase, timeout time.Duration) *corev1.Pod {
	t.Helper()
	return c.WaitPod(t, namespace, name, timeout, string(phase), func(p *corev1.Pod) bool {
		if p == nil {
			return false
		}
		if p.Status.Phase != phase && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
			t.Fatalf("pod %s/%s: %s, want %s\n%s", namespace, name, p.Status.Phase, phase, c.Describe(namespace, name))
		}
		return p.Status.Phase == phase
	})
}

// WaitGone waits until the pod no longer exists.
func (c *Cluster) WaitGone(t testing.TB, namespace, name string, timeout time.Duration) {
	t.Helper()
	c.WaitPod(t, namespace, name, timeout, "deleted", func(p *corev1.Pod) bool { return p == nil })
}

// Logs returns a container's log.
func (c *Cluster) Logs(t testing.TB, namespace, pod, container string) string {
	t.Helper()
	args := []string{"-n", namespace, "logs", pod}
	if container != "" {
		args = append(args, "-c", container)
	}
	return c.Kubectl(t, args...)
}

// Events returns the events about the pod namespace/name that exists now, oldest first — not those of an
// earlier pod of the same name (events outlive their pods by an hour).
func (c *Cluster) Events(t testing.TB, namespace, name string) []corev1.Event {
	t.Helper()
	selector := "involvedObject.name=" + name
	if uid, err := c.Run("-n", namespace, "get", "pod", name, "-o", "jsonpath={.metadata.uid}"); err == nil && uid != "" {
		selector += ",involvedObject.uid=" + uid
	}
	var l corev1.EventList
	c.getJSON(t, &l, "-n", namespace, "get", "events", "--field-selector", selector, "--sort-by=.metadata.creationTimestamp")
	return l.Items
}

// Describe is the pod's state and events, for failure messages.
func (c *Cluster) Describe(namespace, name string) string {
	out, err := c.Run("-n", namespace, "describe", "pod", name)
	if err != nil {
		return err.Error()
	}
	return out
}

// DriverPod is the name of the node plugin's pod (the DaemonSet's one pod on the single node).
func (c *Cluster) DriverPod(t testing.TB) string {
	t.Helper()
	out := c.Kubectl(t, "-n", Namespace, "get", "pods", "-l", "app.kubernetes.io/component=node",
		"--field-selector=status.phase=Running", "-o", "jsonpath={.items[*].metadata.name}")
	names := strings.Fields(out)
	if len(names) != 1 {
		t.Fatalf("want one running node plugin pod, got %q", out)
	}
	return names[0]
}

// WaitDriverRegistered waits until the kubelet lists modelpack.csi.dev on the node again (after a restart).
func (c *Cluster) WaitDriverRegistered(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, _ := c.Run("get", "csinode", c.Node, "-o", "jsonpath={.spec.drivers[*].name}")
		if strings.Contains(out, "modelpack.csi.dev") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("modelpack.csi.dev not registered on %s after %s", c.Node, timeout)
		}
		c.poll()
	}
}

func (c *Cluster) getJSON(t testing.TB, v any, args ...string) {
	t.Helper()
	out := c.Kubectl(t, append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
}

// RestartKubelet stops the kubelet (SIGTERM, by the pid up.sh recorded), starts it again with the same
// arguments and waits until the node is Ready. Running pods and their mounts are untouched by design.
func (c *Cluster) RestartKubelet(t testing.TB) {
	t.Helper()
	pidFile := filepath.Join(c.Dir, "pids", "kubelet.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("stop kubelet %d: %v", pid, err)
	}
	for syscall.Kill(pid, 0) == nil {
		time.Sleep(100 * time.Millisecond)
	}
	raw, err := os.ReadFile(filepath.Join(c.Dir, "kubelet.args"))
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
	logf, err := os.OpenFile(filepath.Join(c.Dir, "logs", "kubelet.log"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session: the kubelet outlives this test process; down.sh stops it by the pid written below.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.WaitNodeReady(t, 2*time.Minute)
}

// WaitNodeReady waits until the node reports Ready with a heartbeat newer than the call.
func (c *Cluster) WaitNodeReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	since := time.Now().Add(-time.Second)
	deadline := time.Now().Add(timeout)
	for {
		var n corev1.Node
		out, err := c.Run("get", "node", c.Node, "-o", "json")
		if err == nil && json.Unmarshal([]byte(out), &n) == nil {
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue && cond.LastHeartbeatTime.After(since) {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not Ready after %s", c.Node, timeout)
		}
		c.poll()
	}
}

// WaitLog waits until the pod's (first container's) log contains marker, and returns the log.
func (c *Cluster) WaitLog(t testing.TB, namespace, pod, marker string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, err := c.Run("-n", namespace, "logs", pod)
		if err == nil && strings.Contains(out, marker) {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s: no %q in its log after %s:\n%s\n%s", namespace, pod, marker, timeout, out, c.Describe(namespace, pod))
		}
		c.poll()
	}
}
