//go:build fleet

// Package fleet runs several simulated nodes on one machine — each a `modelpack csi-driver` process with a Kraken
// agent of its own as its registry mirror — against a real registry, Kraken's tracker, origin and build-index, and
// checks what the P2P layer promises and what it must not be trusted with: N nodes cost the registry about one
// copy of a model, a peer that serves wrong bytes costs a refetch from the registry and never a wrong mount, and a
// node whose agent dies mid-pull finishes from the registry. Run with `make e2e-fleet` (root, bin/kraken, nginx).
package fleet

import (
	"bytes"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/e2e/fleet/kraken"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

const nodes = 3

// model is a safetensors model of shards shards of size bytes each, seeded by seed, pushed to the registry itself
// (not through the counting proxy) as repo:v1; it returns the files and the digests of the weights.
func model(t testing.TB, o *origin, repo string, shards int, size int64, seed uint64) (map[string][]byte, []digest.Digest) {
	t.Helper()
	files := map[string][]byte{}
	var ds []digest.Digest
	for i := range shards {
		b := testmodel.Shard(t, size, seed+uint64(i))
		files[testmodel.ShardName(i, shards)] = b
		ds = append(ds, digest.FromBytes(b))
	}
	testmodel.Push(t, o.reg.Host, repo, "v1", files, nil)
	return files, ds
}

// mounted fails the test unless target holds exactly files.
func mounted(t testing.TB, name, target string, files map[string][]byte) {
	t.Helper()
	for _, f := range slices.Sorted(maps.Keys(files)) {
		got, err := os.ReadFile(filepath.Join(target, f))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(got, files[f]) {
			t.Fatalf("%s: %s in the mount differs from what was pushed", name, f)
		}
	}
}

func copies(n, size int64) float64 { return float64(n) / float64(size) }

// TestFleetPullsOneCopy publishes one model on every node at once, through each node's Kraken agent: every mount
// holds the pushed bytes and the registry served about one copy of the weights (Kraken's origin reads each blob
// once; the agents share it). The same nodes straight to the registry cost one copy per node.
func TestFleetPullsOneCopy(t *testing.T) {
	dir := t.TempDir()
	testenv.NoMountsLeftUnder(t, dir)
	o := startOrigin(t)
	files, weights := model(t, o, "models/fleet", 2, 16<<20, 100)
	size := int64(2 * 16 << 20)
	fl := kraken.Start(t, o.Host, nodes)

	p2p := startNodes(t, dir, o, nodes, fl.Agents, "p2p")
	targets, p2pTook := publishAll(t, p2p, "models/fleet:v1", "pod-p2p")
	for i, target := range targets {
		mounted(t, p2p[i].name, target, files)
	}
	viaKraken, viaDriver := o.bytes("kraken", weights...), o.bytes("driver", weights...)

	direct := startNodes(t, dir, o, nodes, nil, "direct")
	before := o.bytes("", weights...)
	targets, directTook := publishAll(t, direct, "models/fleet:v1", "pod-direct")
	for i, target := range targets {
		mounted(t, direct[i].name, target, files)
	}
	straight := o.bytes("", weights...) - before

	t.Logf("FLEET N=%d model %d MiB: P2P (Kraken) registry served %.2f copies (%.2f to Kraken's origin, %.2f to drivers) in %s; "+
		"direct %.2f copies in %s", nodes, size>>20, copies(viaKraken+viaDriver, size), copies(viaKraken, size),
		copies(viaDriver, size), p2pTook.Round(time.Millisecond), copies(straight, size), directTook.Round(time.Millisecond))
	if viaKraken+viaDriver >= 2*size {
		t.Errorf("through Kraken the registry served %.2f copies of the weights to %d nodes, want fewer than 2",
			copies(viaKraken+viaDriver, size), nodes)
	}
	if straight < nodes*size {
		t.Errorf("straight to the registry %d nodes cost %.2f copies, want %d (is the count wrong?)", nodes, copies(straight, size), nodes)
	}
}

// TestFleetLyingPeer: an agent whose cached blob has a flipped byte serves it as it is (Kraken does not re-verify
// its cache). The node's publish still succeeds with the pushed bytes: the driver finds the digest mismatch,
// passes over the agent for that blob and reads it from the registry; no bad byte is mounted, on that node or on
// the nodes whose agents may leech pieces from the liar.
func TestFleetLyingPeer(t *testing.T) {
	dir := t.TempDir()
	testenv.NoMountsLeftUnder(t, dir)
	o := startOrigin(t)
	files, weights := model(t, o, "models/liar", 1, 12<<20, 200)
	w, size := weights[0], int64(12<<20)
	fl := kraken.Start(t, o.Host, nodes)
	liar := fl.Agents[0]

	// The agent caches the blob when a client on its node asks for it.
	blobURL := "http://" + liar.Registry + "/v2/models/liar/blobs/" + w.String()
	if got := get(t, blobURL); digest.FromBytes(got) != w {
		t.Fatalf("the agent served %s before any fault, want %s", digest.FromBytes(got), w)
	}
	testenv.FlipByte(t, liar.CachedBlob(w), size/2, false)
	if got := get(t, blobURL); digest.FromBytes(got) == w || len(got) != int(size) {
		t.Fatalf("after the flip the agent served %d bytes hashing to %s: the fault did not take", len(got), digest.FromBytes(got))
	}
	fromRegistry := o.bytes("driver", w)

	ns := startNodes(t, dir, o, nodes, fl.Agents, "liar")
	start := time.Now()
	target, err := ns[0].publish("models/liar:v1", "pod-liar")
	if err != nil {
		t.Fatalf("publish on the node whose agent lies: %v", err)
	}
	took := time.Since(start)
	mounted(t, ns[0].name, target, files)
	refetched := o.bytes("driver", w) - fromRegistry
	t.Logf("FLEET lying peer: publish took %s; the driver read %.2f copies of the blob from the registry", took.Round(time.Millisecond), copies(refetched, size))
	if refetched < size {
		t.Errorf("the driver read %d bytes of the blob from the registry, want the whole blob (%d): where did the good bytes come from?", refetched, size)
	}
	// The driver neither logs nor counts the lie today (issue 33 §3 asks that the log, metrics and pod event name
	// the mirror): what this test holds it to is the outcome, the right bytes from the registry.

	// The other nodes: their agents may take pieces from the liar; Kraken checks every piece's hash.
	targets, _ := publishAll(t, ns[1:], "models/liar:v1", "pod-peers")
	for i, target := range targets {
		mounted(t, ns[1+i].name, target, files)
	}
}

// TestFleetAgentKilledMidPull kills one node's agent (and its nginx) while all nodes pull a model and Kraken's
// origin is halfway through reading it from the registry: that node's publish falls back to the registry and
// completes with the pushed bytes, and the other nodes finish through their agents.
func TestFleetAgentKilledMidPull(t *testing.T) {
	dir := t.TempDir()
	testenv.NoMountsLeftUnder(t, dir)
	o := startOrigin(t)
	files, weights := model(t, o, "models/killed", 1, 24<<20, 300)
	w, size := weights[0], int64(24<<20)
	fl := kraken.Start(t, o.Host, nodes)
	ns := startNodes(t, dir, o, nodes, fl.Agents, "killed")
	victim := fl.Agents[1]

	// The victim's node asks first and alone: once Kraken's origin is halfway through reading the blob from the
	// registry, the victim's agent asked for it (only its driver pulls), and that driver waits on the agent (an agent
	// answers once it holds the whole blob). The other nodes then join the pull, the agent is killed and the origin
	// goes on.
	reached, release := o.holdAt(w, size/2)
	defer release()
	targets := make([]string, nodes)
	var victimErr error
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() { targets[1], victimErr = ns[1].publish("models/killed:v1", "pod-killed") })
	select {
	case <-reached:
	case <-time.After(2 * time.Minute):
		release()
		wg.Wait()
		t.Fatalf("Kraken's origin never read half of the blob from the registry (victim's publish: %v)", victimErr)
	}
	others := []*node{ns[0], ns[2]}
	var rest []string
	wg.Go(func() { rest, _ = publishAllErr(t, others, "models/killed:v1", "pod-killed") })
	victim.Kill()
	release()
	wg.Wait()
	took := time.Since(start)
	if victimErr != nil {
		t.Fatalf("publish on the node whose agent was killed: %v", victimErr)
	}
	if t.Failed() {
		return
	}
	targets[0], targets[2] = rest[0], rest[1]
	for i, target := range targets {
		mounted(t, ns[i].name, target, files)
	}
	t.Logf("FLEET agent killed mid-pull: all %d publishes done in %s; registry served %.2f copies (%.2f to Kraken, %.2f to drivers)",
		nodes, took.Round(time.Millisecond), copies(o.bytes("", w), size), copies(o.bytes("kraken", w), size), copies(o.bytes("driver", w), size))
	// The agent streams a blob only once it holds all of it: the victim's driver had none of it and read it whole.
	if o.bytes("driver", w) < size {
		t.Errorf("the drivers read %d bytes of the blob from the registry, want the whole blob (%d): the node without its agent did not fall back", o.bytes("driver", w), size)
	}
}

func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return b
}
