package e2e

// End to end prepull: the real driver with its cache serves the prepull API, `modelpack prepull --watch` plays
// the prepull DaemonSet on a ConfigMap-shaped directory, the test plays kubelet, and a proxy in front of a real
// registry counts what is fetched.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"

	"github.com/modelpack/modelpack/cache"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
	"github.com/modelpack/modelpack/prepull"
)

func TestPrepullDaemonSet(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.Modelpack(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	proxy := drvStartProxy(t, reg.Host)
	modelA := drvModel{"model.safetensors": randomBytes(t, 3<<20), "config.json": []byte(`{"m":"a"}`)}
	modelB := drvModel{"model.safetensors": randomBytes(t, 2<<20), "config.json": []byte(`{"m":"b"}`)}
	digA := testmodel.Push(t, reg.Host, "models/a", "v1", modelA, nil)
	digB := testmodel.Push(t, reg.Host, "models/b", "v1", modelB, nil)
	refA, refB := proxy.Host+"/models/a:v1", proxy.Host+"/models/b:v1"
	bad := proxy.Host + "/models/missing:v1"

	// One pull at a time, so a failure that held its slot would stall everything after it.
	d := drvStart(t, filepath.Join(dir, "node"), proxy.Host)
	d.stop()
	d.args = append(d.args, "--prepull-concurrency=1")
	d.restart()
	sock := filepath.Join(d.Root, "prepull.sock")
	api := prepull.NewClient(sock)

	// The DaemonSet: the list is a ConfigMap volume, updated by a symlink swap.
	cm := filepath.Join(dir, "configmap")
	writeConfigMapFile(t, cm, "models.yaml", fmt.Sprintf("models:\n  - %s\n  - ref: %s\n  - %s\n", bad, refA, refB))
	metrics := testenv.FreeAddr(t)
	watchLog := filepath.Join(dir, "prepull.log")
	startWatcher(t, bin, "--watch", filepath.Join(cm, "models.yaml"), "--socket", sock, "--metrics-addr", metrics,
		"--node-name", "e2e-node", "--poll", "100ms", "--log-format", "text")

	es := waitEntries(t, api, "configmap", func(m map[string]prepull.Entry) bool {
		return m[refA].State == prepull.StateReady && m[refB].State == prepull.StateReady && m[bad].State == prepull.StateFailed
	})
	if !strings.Contains(es[bad].Error, "not found") {
		t.Errorf("bad reference fails with %q, want the registry's not found", es[bad].Error)
	}
	if es[refA].Digest != digA || es[refB].Digest != digB {
		t.Errorf("digests %s %s, pushed %s %s", es[refA].Digest, es[refB].Digest, digA, digB)
	}

	// The cache shows both pulled and pinned by the list.
	owners := cacheOwners(t, api)
	for ref, dg := range map[string]digest.Digest{refA: digA, refB: digB} {
		if !slices.Contains(owners[dg], "pin:"+prepull.PinName("configmap", ref)) {
			t.Errorf("%s: cache owners %v, want the prepull pin", ref, owners[dg])
		}
	}

	// Per-node state in the metrics and the log, bad reason included.
	eventuallyE2E(t, func() bool {
		m := scrape(t, metrics)
		return m[`modelpack_prepull_state{node="e2e-node",ref="`+refA+`",state="ready"}`] == 1 &&
			m[`modelpack_prepull_state{node="e2e-node",ref="`+bad+`",state="failed"}`] == 1 &&
			m[`modelpack_prepull_progress_ratio{node="e2e-node",ref="`+refB+`"}`] == 1
	})
	if !hasFailureMetric(t, metrics, bad, "not found") {
		t.Error("no failure metric with the reason for the bad reference")
	}
	log := drvRead(t, watchLog)
	if !strings.Contains(log, "ref="+bad) || !strings.Contains(log, "state=failed") || !strings.Contains(log, "reason=") {
		t.Errorf("the watcher log does not report the failure with its reason:\n%s", log)
	}
	if !strings.Contains(log, "ref="+refA+" state=ready") {
		t.Errorf("the watcher log does not report %s ready:\n%s", refA, log)
	}

	// A pod publishing A now is warm: no blob is fetched again.
	before := blobGets(proxy, modelA)
	target := drvKubelet(t, dir, "pod-a")
	node := d.node()
	if err := drvPublish(node, testenv.PublishRequest("csi-a", target, map[string]string{
		"reference": refA, "csi.storage.k8s.io/ephemeral": "true", "csi.storage.k8s.io/pod.name": "pod-a",
		"csi.storage.k8s.io/pod.namespace": "default", "csi.storage.k8s.io/pod.uid": "uid-a",
	}), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := drvRead(t, filepath.Join(target, "model.safetensors")); got != string(modelA["model.safetensors"]) {
		t.Fatal("the mounted weights differ from the pushed ones")
	}
	if after := blobGets(proxy, modelA); after != before {
		t.Errorf("the warm publish fetched blobs: %d blob GETs before, %d after", before, after)
	}

	// A leaves the list: unpinned at once (the pod still holds it), evicted once the pod is gone. B stays.
	writeConfigMapFile(t, cm, "models.yaml", fmt.Sprintf("models:\n  - %s\n  - %s\n", refB, bad))
	waitEntries(t, api, "configmap", func(m map[string]prepull.Entry) bool { _, ok := m[refA]; return !ok })
	eventuallyE2E(t, func() bool {
		o := cacheOwners(t, api)[digA]
		return slices.Equal(o, []string{"csi-a"}) || (len(o) == 1 && !strings.HasPrefix(o[0], "pin:"))
	})
	drvUnpublish(t, node, "csi-a", target)
	if o := cacheOwners(t, api)[digB]; !slices.Contains(o, "pin:"+prepull.PinName("configmap", refB)) {
		t.Errorf("B unpinned while listed: %v", o)
	}
	eventuallyE2E(t, func() bool {
		m := scrape(t, metrics)
		_, stale := m[`modelpack_prepull_state{node="e2e-node",ref="`+refA+`",state="ready"}`]
		return !stale && m[`modelpack_prepull_list_entries{node="e2e-node"}`] == 2
	})

	// The driver dies and comes back: the pinned entry is adopted from the cache, and the watcher sends the list
	// again at once for what the new driver does not know.
	d.kill()
	d.restart()
	es = waitEntries(t, api, "configmap", func(m map[string]prepull.Entry) bool {
		return m[refB].State == prepull.StateReady && m[bad].State == prepull.StateFailed && len(m) == 2
	})
	if es[refB].Digest != digB {
		t.Errorf("restored %s at %s, want %s", refB, es[refB].Digest, digB)
	}

	// Evictable: with the node stopped, a GC of its cache under the tightest limit evicts A and keeps B, whose
	// pin outlives the driver process.
	d.stop()
	c, err := cache.Open(cache.Options{Root: filepath.Join(d.Root, "cache"), MaxBytes: 1, MinAge: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.GC(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(st.Evicted, digA) || slices.Contains(st.Evicted, digB) {
		t.Errorf("GC evicted %v; want A (%s) and not B (%s)", st.Evicted, digA, digB)
	}
	if !c.Has(digB) || c.Has(digA) {
		t.Errorf("after GC: has A %v, has B %v", c.Has(digA), c.Has(digB))
	}
}

func TestPrepullCLI(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.Modelpack(t)
	dir := t.TempDir()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	dig := testmodel.Push(t, reg.Host, "models/c", "v1", drvModel{"model.safetensors": randomBytes(t, 1<<20)}, nil)
	ref := reg.Host + "/models/c:v1"
	d := drvStart(t, filepath.Join(dir, "node"), reg.Host)
	sock := filepath.Join(d.Root, "prepull.sock")

	out, err := exec.Command(bin, "prepull", "--socket", sock, "-o", "json", ref).Output()
	if err != nil {
		t.Fatalf("prepull: %v\n%s", err, exitStderr(err))
	}
	var entries []prepull.Entry
	if err := json.Unmarshal(out, &entries); err != nil || len(entries) != 1 {
		t.Fatalf("output %s: %v", out, err)
	}
	if e := entries[0]; e.State != prepull.StateReady || e.Digest != dig || e.Total < 1<<20 {
		t.Errorf("entry %+v", e)
	}
	if !slices.Contains(cacheOwners(t, prepull.NewClient(sock))[dig], "pin:"+prepull.PinName(prepull.DefaultList, ref)) {
		t.Error("not pinned")
	}

	// A list file with a bad entry: the good one is ready, the command fails naming the bad one and why.
	list := filepath.Join(dir, "list.yaml")
	badRef := reg.Host + "/models/nope:v1"
	if err := os.WriteFile(list, []byte("- "+ref+"\n- "+badRef+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "prepull", "--socket", sock, "--file", list)
	outb, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(outb), badRef+": resolve:") || !strings.Contains(string(outb), "1 of 2 failed") {
		t.Errorf("prepull with a bad entry: %v\n%s", err, outb)
	}

	out, err = exec.Command(bin, "prepull", "status", "--socket", sock).Output()
	if err != nil || !strings.Contains(string(out), "ready") || !strings.Contains(string(out), "failed") || !strings.Contains(string(out), "resolve:") {
		t.Errorf("status: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "prepull", "cache", "--socket", sock).Output()
	if err != nil || !strings.Contains(string(out), dig.String()) || !strings.Contains(string(out), "pin:"+prepull.PinName(prepull.DefaultList, ref)) {
		t.Errorf("prepull cache: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "prepull", "cancel", "--socket", sock, ref, badRef).CombinedOutput(); err != nil {
		t.Fatalf("cancel: %v\n%s", err, out)
	}
	if o := cacheOwners(t, prepull.NewClient(sock))[dig]; len(o) != 0 {
		t.Errorf("owners after cancel: %v", o)
	}
	if out, err := exec.Command(bin, "prepull", "cache", "--socket", sock).Output(); err != nil || !strings.Contains(string(out), "evictable") {
		t.Errorf("prepull cache after cancel: %v\n%s", err, out)
	}

	// Prepulled by digest, a model mounts with the registry gone.
	byDigest := reg.Host + "/models/c@" + dig.String()
	if out, err := exec.Command(bin, "prepull", "-q", "--socket", sock, byDigest).CombinedOutput(); err != nil {
		t.Fatalf("prepull %s: %v\n%s", byDigest, err, out)
	}
	reg.Stop()
	drvCleanupMounts(t, dir)
	target := drvKubelet(t, dir, "offline")
	if err := drvPublish(d.node(), testenv.PublishRequest("csi-offline", target, map[string]string{"reference": byDigest}), 30*time.Second); err != nil {
		t.Fatalf("publish of a prepulled digest with the registry down: %v", err)
	}
	drvUnpublish(t, d.node(), "csi-offline", target)
}

// writeConfigMapFile updates dir the way the kubelet updates a ConfigMap volume: a new timestamped directory,
// ..data swapped to it atomically, and the file a symlink through ..data.
func writeConfigMapFile(t *testing.T, dir, name, content string) {
	t.Helper()
	ts := filepath.Join(dir, fmt.Sprintf("..%d", time.Now().UnixNano()))
	if err := os.MkdirAll(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ts, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, name)); err != nil {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// startWatcher runs `modelpack prepull` with args until the test ends, its log in dir/prepull.log.
func startWatcher(t *testing.T, bin string, args ...string) {
	t.Helper()
	logPath := ""
	for i, a := range args {
		if a == "--watch" {
			logPath = filepath.Join(filepath.Dir(filepath.Dir(args[i+1])), "prepull.log")
		}
	}
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"prepull"}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("prepull watcher log:\n%s", b)
		}
	})
}

func waitEntries(t *testing.T, c *prepull.Client, list string, cond func(map[string]prepull.Entry) bool) map[string]prepull.Entry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var since uint64
	var last map[string]prepull.Entry
	for {
		s, err := c.Entries(ctx, list, since)
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("timed out; last entries: %+v", last)
			}
			time.Sleep(100 * time.Millisecond) // the API may not be up yet
			continue
		}
		last = map[string]prepull.Entry{}
		for _, e := range s.Entries {
			last[e.Ref] = e
		}
		if cond(last) {
			return last
		}
		since = s.Version
	}
}

// cacheOwners maps each manifest in the node cache to its owners.
func cacheOwners(t *testing.T, c *prepull.Client) map[digest.Digest][]string {
	t.Helper()
	es, err := c.Cache(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := map[digest.Digest][]string{}
	for _, e := range es {
		m[e.Digest] = e.Owners
	}
	return m
}

func blobGets(p *drvProxy, files drvModel) int {
	n := 0
	for _, b := range files {
		n += p.blobGetsOf(digestOf(b))
	}
	return n
}

// scrape reads a Prometheus text exposition into series → value.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndex(line, " ")
		var v float64
		if _, err := fmt.Sscan(line[i+1:], &v); err == nil {
			m[line[:i]] = v
		}
	}
	return m
}

func hasFailureMetric(t *testing.T, addr, ref, reason string) bool {
	for series, v := range scrape(t, addr) {
		if strings.HasPrefix(series, "modelpack_prepull_failure{") && strings.Contains(series, `ref="`+ref+`"`) &&
			strings.Contains(series, reason) && v == 1 {
			return true
		}
	}
	return false
}

func eventuallyE2E(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func exitStderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

// TestPrepullTrustPolicy: the node's policy refuses an unsigned model for a prepull exactly as for a mount, before
// any of its blobs is fetched, while the signed one is pulled and pinned.
func TestPrepullTrustPolicy(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.Modelpack(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	proxy := drvStartProxy(t, reg.Host)
	signed := drvModel{"model.safetensors": testmodel.Shard(t, 1<<20, 1)}
	unsigned := drvModel{"model.safetensors": testmodel.Shard(t, 1<<20, 2)}
	testmodel.Push(t, reg.Host, "models/signed", "v1", signed, nil)
	testmodel.Push(t, reg.Host, "models/unsigned", "v1", unsigned, nil)
	refSigned, refUnsigned := proxy.Host+"/models/signed:v1", proxy.Host+"/models/unsigned:v1"

	keys := t.TempDir()
	env := append(os.Environ(), "COSIGN_PASSWORD=e2e", "HOME="+keys, "DOCKER_CONFIG="+filepath.Join(keys, ".docker"))
	for _, args := range [][]string{
		{"key", "generate", "--output-key-prefix", filepath.Join(keys, "mp")},
		{"sign", refSigned, "--key", filepath.Join(keys, "mp.key"), "--plain-http"},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("modelpack %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	policy := filepath.Join(keys, "policy.yaml")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`default: {none: true}
rules:
- name: models
  match: [%q]
  keys: [%q]
  transparencyLog: waive
`, proxy.Host+"/models/**", filepath.Join(keys, "mp.pub"))), 0o644); err != nil {
		t.Fatal(err)
	}

	d := drvStart(t, filepath.Join(dir, "node"), proxy.Host)
	d.stop()
	d.args = append(d.args, "--policy", policy)
	d.restart()
	api := prepull.NewClient(filepath.Join(d.Root, "prepull.sock"))
	if _, err := api.SetList(context.Background(), "configmap", []string{refUnsigned, refSigned}); err != nil {
		t.Fatal(err)
	}
	es := waitEntries(t, api, "configmap", func(m map[string]prepull.Entry) bool {
		return m[refSigned].State == prepull.StateReady && m[refUnsigned].State == prepull.StateFailed
	})
	if e := es[refUnsigned].Error; !strings.HasPrefix(e, "trust policy: ") || !strings.Contains(e, "no signature") {
		t.Errorf("unsigned model fails with %q, want the policy's refusal", e)
	}
	if n := blobGets(proxy, unsigned); n != 0 {
		t.Errorf("the refused model's blobs were fetched %d times", n)
	}
	owners := cacheOwners(t, api)
	if len(owners) != 1 || !slices.Contains(owners[es[refSigned].Digest], "pin:"+prepull.PinName("configmap", refSigned)) {
		t.Errorf("cache %v, want only the signed model, pinned", owners)
	}
}

// TestPrepullTagOffline: a model prepulled by tag is present on the node under that tag, as if the driver had
// pulled it: with the registry gone, after the entry left its list and the driver restarted, a pod mounting the
// tag with pullPolicy IfNotPresent gets it without asking the registry, while Always still has to ask.
func TestPrepullTagOffline(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	proxy := drvStartProxy(t, reg.Host)
	model := drvModel{"model.safetensors": randomBytes(t, 1<<20), "config.json": []byte(`{"m":"offline"}`)}
	dig := testmodel.Push(t, reg.Host, "models/offline", "v1", model, nil)
	ref := proxy.Host + "/models/offline:v1"
	d := drvStartWith(t, filepath.Join(dir, "node"), nil, proxy.Host)
	api := prepull.NewClient(filepath.Join(d.Root, "prepull.sock"))
	ctx := context.Background()

	if _, err := api.SetList(ctx, "configmap", []string{ref}); err != nil {
		t.Fatal(err)
	}
	if es := waitEntries(t, api, "configmap", func(m map[string]prepull.Entry) bool { return m[ref].State == prepull.StateReady }); es[ref].Digest != dig {
		t.Fatalf("prepulled %s at %s, pushed %s", ref, es[ref].Digest, dig)
	}
	// Off the list the model is only evictable, not gone, and what the tag resolved to still holds.
	if _, err := api.SetList(ctx, "configmap", nil); err != nil {
		t.Fatal(err)
	}
	reg.Stop()
	d.kill()
	d.restart()

	node := d.node()
	attrs := func(policy string) map[string]string {
		return map[string]string{"reference": ref, "pullPolicy": policy, "csi.storage.k8s.io/ephemeral": "true"}
	}
	asked := proxy.manifestRequests()
	target := drvKubelet(t, dir, "offline")
	if err := drvPublish(node, testenv.PublishRequest("csi-offline", target, attrs("IfNotPresent")), 30*time.Second); err != nil {
		t.Fatalf("IfNotPresent publish of a prepulled tag with the registry down: %v", err)
	}
	if got := drvRead(t, filepath.Join(target, "model.safetensors")); got != string(model["model.safetensors"]) {
		t.Error("the mounted weights differ from the pushed ones")
	}
	if n := proxy.manifestRequests() - asked; n != 0 {
		t.Errorf("the IfNotPresent publish asked the registry for manifests %d times", n)
	}
	drvUnpublish(t, node, "csi-offline", target)

	err := drvPublish(node, testenv.PublishRequest("csi-always", drvKubelet(t, dir, "always"), attrs("Always")), 30*time.Second)
	drvWantCode(t, err, codes.Unavailable, "")
}
