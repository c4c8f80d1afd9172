//go:build fleet

package cluster

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
)

// agentMirror is the node-local Kraken agent as the driver's hosts.toml names it (deploy/components/p2p-kraken).
const agentMirror = "127.0.0.1:16000"

// modelBytes is the size of everything a pull reads from the registry for ref's manifest: config and layers.
func modelBytes(t *testing.T, c *harness.Cluster, repo, tag string) (total int64, digests []string) {
	t.Helper()
	m, _ := c.Manifest(t, repo, tag)
	total, digests = m.Config.Size, []string{m.Config.Digest}
	for _, l := range m.Layers {
		total += l.Size
		digests = append(digests, l.Digest)
	}
	return total, digests
}

// copies is the bytes the registry served for digests since mark, in copies of a model of total bytes.
func copies(t *testing.T, c *harness.Cluster, mark harness.LogMark, digests []string, total int64) (float64, map[string]*harness.BlobServe) {
	t.Helper()
	served := c.BlobsServed(t, mark)
	var sent int64
	for _, d := range digests {
		if b := served[d]; b != nil {
			sent += b.Bytes
		}
	}
	return float64(sent) / float64(total), served
}

// TestKrakenOneCopy: a cold model read on all three nodes at once through their Kraken agents costs the registry
// about one copy (Kraken's origin fetches each blob once; agents share it), and every pod reads the right bytes.
func TestKrakenOneCopy(t *testing.T) {
	c := harness.Connect(t)
	src := model(t, 2, 3, 8<<20)
	ref, _ := c.PushModel(t, src, "e2e/kraken-one-copy:v1")
	total, digests := modelBytes(t, c, "e2e/kraken-one-copy", "v1")
	mark := c.Mark(t)
	readOnEveryNode(t, c, "onecopy", ref, src)
	n, served := copies(t, c, mark, digests, total)
	t.Logf("%d nodes read %d bytes each; the registry served %.2f copies", len(c.Nodes), total, n)
	if n > 1.1 {
		t.Errorf("the registry served %.2f copies of the model to %d nodes, want ≤ 1.1: %s", n, len(c.Nodes), describe(served, digests))
	}
	// Both of a node's copies of every tenant's blobs, the agent's store and the driver's cache, are root's alone.
	for _, node := range c.Nodes {
		for _, dir := range []string{"kraken", filepath.Join("cache", "cache")} {
			p := filepath.Join(c.Dir, "nodes", node, dir)
			fi, err := os.Stat(p)
			if err != nil {
				t.Errorf("node %s: %v", node, err)
			} else if fi.Mode().Perm() != 0o700 {
				t.Errorf("node %s: %s is %s, want 0700", node, p, fi.Mode().Perm())
			}
		}
	}
}

// TestKrakenAgentKilled: one node's agent is killed (SIGKILL, by PID) while that node's driver is in the middle
// of reading the model through it, during a cold pull on all three nodes. That node's pull moves on to the
// registry, the other nodes' pulls go on through Kraken, and every pod reads the right bytes.
//
// The gate, without sleeps: Kraken's origin is stopped (SIGSTOP) before the pods start, so no agent can answer;
// once the victim's driver holds an open request to its agent, the agent is killed and the origin continued.
func TestKrakenAgentKilled(t *testing.T) {
	c := harness.Connect(t)
	victim := c.Nodes[len(c.Nodes)-1]
	src := model(t, 3, 3, 8<<20)
	ref, _ := c.PushModel(t, src, "e2e/kraken-agent-killed:v1")
	total, digests := modelBytes(t, c, "e2e/kraken-agent-killed", "v1")

	origin, err := nodePID(c.Nodes[0], "kraken-origin")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(origin, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume := func() {
		once.Do(func() {
			if err := syscall.Kill(origin, syscall.SIGCONT); err != nil {
				t.Errorf("continue Kraken's origin %d: %v", origin, err)
			}
		})
	}
	t.Cleanup(resume)

	mark := c.Mark(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		deadline := time.Now().Add(2 * time.Minute)
		defer resume()
		for agentClients(victim) == 0 {
			if time.Now().After(deadline) {
				t.Errorf("node %s's driver never opened a request to its agent", victim)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		agent, err := nodePID(victim, "kraken-agent")
		if err != nil {
			t.Error(err)
			resume()
			return
		}
		t.Logf("node %s: its driver waits on its agent (pid %d); killing it", victim, agent)
		if err := syscall.Kill(agent, syscall.SIGKILL); err != nil {
			t.Errorf("kill agent %d: %v", agent, err)
		}
		resume()
	}()
	// readOnEveryNode waits for the pods; the gate above runs meanwhile.
	readOnEveryNodeAsync(t, c, "killed", ref, src, done)

	n, served := copies(t, c, mark, digests, total)
	victimIP := c.NodeIPs[victim]
	var direct int
	for _, d := range digests[1:] {
		if b := served[d]; b != nil {
			direct += b.ByClient[victimIP]
		}
	}
	t.Logf("the registry served %.2f copies; %d layer GETs came from %s (%s) directly", n, direct, victim, victimIP)
	if direct == 0 {
		t.Errorf("node %s read no layer from the registry after its agent died: %s", victim, describe(served, digests))
	}
	// One copy for Kraken's origin, at most one for the node whose agent died.
	if n > 2.1 {
		t.Errorf("the registry served %.2f copies, want ≤ 2.1 (origin + the node without an agent): %s", n, describe(served, digests))
	}
}

// TestKrakenLyingAgent: a node's agent holds a blob whose cached file has a flipped byte (Kraken does not
// re-verify its cache). The driver refuses those bytes, reads the blob from the registry instead, the pod reads
// the right bytes, and the driver's log and its lying-sources metric name the agent.
func TestKrakenLyingAgent(t *testing.T) {
	c := harness.Connect(t)
	victim := c.Nodes[0]
	src := model(t, 4, 2, 4<<20)
	ref, _ := c.PushModel(t, src, "e2e/kraken-lying:v1")
	m, _ := c.Manifest(t, "e2e/kraken-lying", "v1")
	layer := m.Layers[0].Digest

	// The victim's agent fetches the blob (as for any client) and caches it; then one byte of its file is flipped.
	out, err := exec.Command("ip", "netns", "exec", victim, "curl", "-sf", "-o", "/dev/null",
		"http://"+agentMirror+"/v2/e2e/kraken-lying/blobs/"+layer).CombinedOutput()
	if err != nil {
		t.Fatalf("prime %s's agent with %s: %v: %s", victim, layer, err, out)
	}
	hex := strings.TrimPrefix(layer, "sha256:")
	data := filepath.Join(c.Dir, "nodes", victim, "kraken", "cache", hex[:2], hex[2:4], hex, "data")
	flipByte(t, data, m.Layers[0].Size/2)

	before := lyingCount(t, c, victim)
	mark := c.Mark(t)
	const mnt = "/models/m"
	c.Apply(t, c.PodManifest(harness.PodSpec{Name: "lying", Node: victim, Script: harness.SumScript(mnt),
		Volumes: []harness.Volume{{Name: "model", MountPath: mnt, CSI: map[string]string{"reference": ref}}}}))
	c.WaitPhase(t, "default", "lying", "Succeeded", podTimeout)
	if got, want := harness.ParseSums(t, c.Logs(t, "default", "lying", ""), mnt), harness.TreeSums(t, src); !maps.Equal(got, want) {
		t.Errorf("the pod read other bytes than the source:\ngot  %v\nwant %v", got, want)
	}
	if b := c.BlobsServed(t, mark)[layer]; b == nil || b.ByClient[c.NodeIPs[victim]] == 0 {
		t.Errorf("node %s did not read %s from the registry after its agent lied", victim, layer)
	}
	if after := lyingCount(t, c, victim); after <= before {
		t.Errorf("node %s: modelpack_cache_lying_sources_total{source=~%q} is %v, was %v: the lie is not counted", victim, agentMirror, after, before)
	}
	log := c.Logs(t, harness.Namespace, driverPods(t, c)[victim], "modelpack")
	if !regexp.MustCompile(regexp.QuoteMeta(agentMirror) + `.*` + regexp.QuoteMeta(layer) + `|` + regexp.QuoteMeta(layer) + `.*` + regexp.QuoteMeta(agentMirror)).MatchString(log) {
		t.Errorf("the driver's log on %s names no %s serving wrong bytes for %s", victim, agentMirror, layer)
	}
}

// readOnEveryNodeAsync is readOnEveryNode while a gate goroutine runs; it waits for the gate before returning.
func readOnEveryNodeAsync(t *testing.T, c *harness.Cluster, prefix, ref, src string, gate <-chan struct{}) {
	t.Helper()
	defer func() { <-gate }()
	readOnEveryNode(t, c, prefix, ref, src)
}

// nodePID is the host PID of the one process named comm in node's network namespace.
func nodePID(node, comm string) (int, error) {
	out, err := exec.Command("ip", "netns", "pids", node).Output()
	if err != nil {
		return 0, fmt.Errorf("ip netns pids %s: %v", node, err)
	}
	var found []int
	for _, f := range strings.Fields(string(out)) {
		b, err := os.ReadFile("/proc/" + f + "/comm")
		if err == nil && strings.TrimSpace(string(b)) == comm {
			pid, _ := strconv.Atoi(f)
			found = append(found, pid)
		}
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("want one %s in %s's namespace, found pids %v", comm, node, found)
	}
	return found[0], nil
}

// agentClients counts the established connections to the agent's registry port in node's namespace (0 when ss
// fails: the caller polls).
func agentClients(node string) int {
	out, err := exec.Command("ip", "netns", "exec", node, "ss", "-Htn", "state", "established", "( sport = :16000 )").Output()
	if err != nil {
		return 0
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(line) != "" {
			n++
		}
	}
	return n
}

func flipByte(t *testing.T, path string, at int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, at); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, at); err != nil {
		t.Fatal(err)
	}
}

var lyingLine = regexp.MustCompile(`(?m)^modelpack_cache_lying_sources_total\{source="([^"]*)"\} (\S+)$`)

// lyingCount sums the node's driver's lying-sources counter over the sources that name the agent.
func lyingCount(t *testing.T, c *harness.Cluster, node string) float64 {
	t.Helper()
	var n float64
	for _, m := range lyingLine.FindAllStringSubmatch(nodeMetrics(t, c, node), -1) {
		if strings.Contains(m[1], agentMirror) {
			v, _ := strconv.ParseFloat(m[2], 64)
			n += v
		}
	}
	return n
}

func describe(served map[string]*harness.BlobServe, digests []string) string {
	var b strings.Builder
	for _, d := range digests {
		if s := served[d]; s != nil {
			fmt.Fprintf(&b, "\n  %s: %d GETs, %d bytes, by client %v", d, s.GETs, s.Bytes, s.ByClient)
		} else {
			fmt.Fprintf(&b, "\n  %s: not served", d)
		}
	}
	return b.String()
}
