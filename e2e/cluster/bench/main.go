//go:build cluster

// Command bench measures pod start on the real local cluster (e2e/cluster): from `kubectl apply` to the
// container having read the last byte of the model, for
//
//	(a) the modelpack CSI inline volume,
//	(b) a native image volume holding the same files as one container-image layer,
//	(c) an init container that downloads the model's blobs from the registry into an emptyDir,
//
// cold (node cache emptied and page cache dropped before each run) and warm (page cache dropped, the node has
// the model), each the median of several runs in rotated order, beside curl of the blobs under the same cold
// conditions as the yardstick. It prints where the time of (a) and (b) goes (the driver's phase logs, the
// kubelet's and containerd's logs, the container's own clock) and the scenarios users hit: four replicas at once,
// a prepulled model, the model cached under another tag. Ratios are against (b) and (c).
//
// It starts its own cluster under the cluster lock (waiting for it) and always tears it down — on success,
// failure or interrupt; BENCH_CLUSTER=running uses a cluster that is already up and leaves it up.
//
//	go run -tags cluster ./e2e/cluster/bench                          # MODEL_DIR, default the 2 GiB bench model
//	BENCH_MODEL_SIZE=128MiB go run -tags cluster ./e2e/cluster/bench  # a 4 × 128 MiB model, for quick runs
//
// BENCH_EXPERIMENT=memlimit, readahead, flushdelay or fleetcpu runs one experiment instead (experiment.go).
// BENCH_COLD_RUNS (default 5) and BENCH_WARM_RUNS (5) set the runs per figure, BENCH_FLEET_RUNS (5) the Deployments
// of each size, BENCH_PARTS (table,fleet,prepulled,othertag) what runs.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	humanize "github.com/dustin/go-humanize"
	corev1 "k8s.io/api/core/v1"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
	stats "github.com/modelpack/modelpack/internal/bench"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

const (
	lockPath   = "/tmp/modelpack-cluster.lock"
	work       = "/var/tmp/modelpack-bench"
	podTimeout = 10 * time.Minute
)

func main() { os.Exit(run()) }

func run() (rc int) {
	root := testenv.RepoRoot()
	if err := os.MkdirAll(work, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	scratch, err := os.MkdirTemp(work, "cluster-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	t := &tb{scratch: scratch}
	var down func()
	teardown := sync.OnceFunc(func() {
		t.runCleanups()
		if down != nil {
			down()
		}
		os.RemoveAll(scratch)
	})
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "bench: interrupted; tearing down")
		teardown()
		os.Exit(130)
	}()
	defer teardown()
	defer func() {
		if r := recover(); r != nil {
			a, ok := r.(abort)
			if !ok {
				panic(r)
			}
			fmt.Fprintln(os.Stderr, "bench: FAILED:", a.msg)
			rc = 1
		}
	}()

	experiment := os.Getenv("BENCH_EXPERIMENT")
	if !slices.Contains([]string{"", "memlimit", "readahead", "flushdelay", "fleetcpu"}, experiment) {
		t.Fatalf("BENCH_EXPERIMENT=%q: valid are memlimit, readahead, flushdelay and fleetcpu", experiment)
	}
	model := benchModel(t)
	if os.Getenv("BENCH_CLUSTER") != "running" {
		down = startCluster(t, root)
	}
	b := &bench{t: t, c: harness.Connect(t), root: root, model: model, scratch: scratch}
	b.c.Poll = pollEvery
	b.prepare()
	switch experiment {
	case "memlimit":
		b.memoryLimitExperiment()
		return 0
	case "readahead":
		b.readaheadExperiment()
		return 0
	case "flushdelay":
		b.flushDelayExperiment()
		return 0
	case "fleetcpu":
		b.fleetCPUExperiment()
		return 0
	}
	parts := benchParts(t)
	if parts["table"] {
		b.table()
	}
	b.scenarios(parts)
	return 0
}

// benchParts is BENCH_PARTS, the parts to run (default all): table, fleet, prepulled, othertag. Without the table
// the scenarios print their times without the ratios to its figures.
func benchParts(t *tb) map[string]bool {
	all := []string{"table", "fleet", "prepulled", "othertag"}
	s := os.Getenv("BENCH_PARTS")
	if s == "" {
		s = strings.Join(all, ",")
	}
	parts := map[string]bool{}
	for _, p := range strings.Split(s, ",") {
		if !slices.Contains(all, p) {
			t.Fatalf("BENCH_PARTS=%q: unknown part %q (valid: %s)", s, p, strings.Join(all, ", "))
		}
		parts[p] = true
	}
	return parts
}

// benchModel is the model directory: MODEL_DIR (make bench's 2 GiB model, generated when missing), or with
// BENCH_MODEL_SIZE a smaller one of four shards of that size, where make bench keeps it.
func benchModel(t *tb) string {
	dir, size := os.Getenv("MODEL_DIR"), "512MiB"
	if s := os.Getenv("BENCH_MODEL_SIZE"); s != "" && s != size {
		dir, size = filepath.Join(work, "model-"+s), s
	} else if dir == "" {
		dir = filepath.Join(work, "model")
	}
	n, err := humanize.ParseBytes(size)
	if err != nil {
		t.Fatalf("BENCH_MODEL_SIZE=%q: %v (a size such as 128MiB)", size, err)
	}
	if err := stats.Model(dir, testmodel.Spec{Shards: 4, ShardSize: int64(n), Seed: 1}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startCluster takes the cluster lock (waiting for another run to finish), starts the cluster with up.sh holding
// it as fd 9 (up.sh then keeps it, and every daemon inherits it) and returns the teardown. Only a run that holds
// the lock may run down.sh: the state directory is the lock holder's.
func startCluster(t *tb, root string) func() {
	lock, err := os.OpenFile(lockPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	waited := false
	for deadline := time.Now().Add(30 * time.Minute); ; {
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster lock %s still busy after 30 min", lockPath)
		}
		if !waited {
			fmt.Fprintf(os.Stderr, "another local cluster holds %s; waiting for it\n", lockPath)
			waited = true
		}
		time.Sleep(2 * time.Second)
	}
	script := func(name string) error {
		cmd := exec.Command("bash", filepath.Join(root, "e2e", "cluster", name))
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		cmd.ExtraFiles = []*os.File{nil, nil, nil, nil, nil, nil, lock} // fd 9, as run.sh passes it
		return cmd.Run()
	}
	down := func() {
		if err := script("down.sh"); err != nil {
			fmt.Fprintf(os.Stderr, "bench: down.sh: %v\n", err)
		}
		lock.Close()
	}
	if err := script("up.sh"); err != nil {
		down()
		t.Fatalf("up.sh: %v", err)
	}
	return down
}

// bench is one run against the cluster.
type bench struct {
	t       *tb
	c       *harness.Cluster
	root    string
	model   string
	scratch string

	modelRef string   // the model by digest (a)
	repo     string   // its repository in the registry
	layers   []string // digest=path of each layer, for (c) and curl
	imageRef string   // the same files as a container-image layer (b)
	size     int64    // bytes of the model's files

	coldCSI, warmCSI float64 // medians, for the scenarios
	n                int     // pods started so far: unique names
	// readAfter, if set, makes pods sleep that long (a sleep(1) duration) before they read, as an inference server
	// importing its code does; their times still run from kubectl apply.
	readAfter string
}

func (b *bench) prepare() {
	t := b.t
	b.repo = "bench/model"
	b.modelRef, _ = b.c.PushModel(t, b.model, b.repo+":v1")
	m, _ := b.c.Manifest(t, b.repo, "v1")
	var files []string
	for _, l := range m.Layers {
		path := l.Annotations["org.cncf.model.filepath"]
		if path == "" {
			t.Fatalf("layer %s has no org.cncf.model.filepath annotation", l.Digest)
		}
		b.layers = append(b.layers, l.Digest+"="+path)
		files = append(files, filepath.Join(b.model, path)+"=/model/"+path)
		b.size += l.Size
	}
	b.imageRef = b.c.PushImage(t, "bench/weights-image:v1", files...)
	fmt.Printf("model: %s, %d files, %s\n", b.model, len(m.Layers), humanize.IBytes(uint64(b.size)))
}

// A variant is one way of getting the model into a pod.
type variant struct{ key, label string }

var variants = []variant{
	{"csi", "(a) modelpack CSI inline volume"},
	{"image", "(b) native image volume, weights as an image layer"},
	{"init", "(c) init container, sequential wget into an emptyDir"},
	{"curl", "curl of the blobs, parallel, to disk (no pod)"},
}

// table runs every variant cold and warm in rotated order and prints the times, the ratios and the breakdown.
func (b *bench) table() {
	coldRuns, warmRuns := envInt(b.t, "BENCH_COLD_RUNS", 5), envInt(b.t, "BENCH_WARM_RUNS", 5)
	cold, warm := map[string][]float64{}, map[string][]float64{}
	phases := map[string][]*breakdown{}
	for i := range coldRuns {
		for _, v := range stats.Rotated(variants, i) {
			b.makeCold(v.key)
			t0 := time.Now()
			r := b.measure(v.key)
			if v.key == "csi" {
				b.flushWindow(t0) // its write-back of the pull must not fall on the next variant's start
			}
			cold[v.key] = append(cold[v.key], r.last)
			if r.phases != nil {
				phases[v.key] = append(phases[v.key], r.phases)
			}
			fmt.Fprintf(os.Stderr, "cold %d %-5s %6.2f s\n", i+1, v.key, r.last)
		}
	}
	// Warm, (a) and (b) alternate on their own and the init container's warm runs follow. An init container's run
	// moves 4 GiB through the disk (the registry reads the blobs, the pod writes them into its emptyDir, deleted
	// with it), and the warm pod right after one read its model slowly in 14 of 19 runs (2 of 19 otherwise, three
	// runs of this bench on 2026-12-02). In a rotation of three, (a) came right after (c) twice per rotation and
	// (b) once.
	warmPhases := map[string][]*breakdown{}
	warmRun := func(i int, v variant) {
		r := b.measure(v.key)
		warm[v.key] = append(warm[v.key], r.last)
		if r.phases != nil {
			warmPhases[v.key] = append(warmPhases[v.key], r.phases)
		}
		fmt.Fprintf(os.Stderr, "warm %d %-5s %6.2f s\n", i+1, v.key, r.last)
	}
	for i := range warmRuns {
		for _, v := range stats.Rotated(variants[:2], i) {
			warmRun(i, v)
		}
	}
	// The same warm start with only the model's pages evicted: the runtime's binaries and the pause image stay
	// in memory, as on a node that keeps starting pods.
	hot := map[string][]float64{}
	for i := range warmRuns {
		for _, v := range stats.Rotated(variants[:2], i) {
			b.evictModel()
			r := b.start(v.key)
			hot[v.key] = append(hot[v.key], r.last)
			fmt.Fprintf(os.Stderr, "warm, model evicted %d %-5s %6.2f s\n", i+1, v.key, r.last)
		}
	}
	disk := b.diskAB(2 * warmRuns)
	for i := range warmRuns {
		warmRun(i, variants[2])
	}
	med := func(m map[string][]float64, k string) float64 { return stats.Median(m[k]) }
	b.coldCSI, b.warmCSI = med(cold, "csi"), med(warm, "csi")

	fmt.Printf("\npod start → last byte read (%s, real kubelet); cold = median of %d, warm = median of %d\n",
		humanize.IBytes(uint64(b.size)), coldRuns, warmRuns)
	fmt.Printf("%-56s %8s %8s %9s %9s %9s\n", "", "cold s", "warm s", "cold/(b)", "cold/(c)", "warm/(b)")
	for _, v := range variants {
		c, w := med(cold, v.key), med(warm, v.key)
		ws, wb := "-", "-"
		if len(warm[v.key]) > 0 {
			ws, wb = fmt.Sprintf("%.2f", w), fmt.Sprintf("%.2fx", w/med(warm, "image"))
		}
		fmt.Printf("%-56s %8.2f %8s %8.2fx %8.2fx %9s\n", v.label, c, ws, c/med(cold, "image"), c/med(cold, "init"), wb)
	}
	fmt.Println("cold runs:", samples(cold), " warm runs:", samples(warm))
	fmt.Printf("warm with only the model's pages evicted (the runtime's own files in memory), median of %d: (a) %.2f s, (b) %.2f s = %.2fx; runs: %s\n",
		warmRuns, med(hot, "csi"), med(hot, "image"), med(hot, "csi")/med(hot, "image"), samples(hot))
	// A warm start is the pod's start, which the driver's publish is part of, then the read of the model, which is
	// the disk's: shown apart, with the disk read from the node, no pod, beside.
	starting, reading := map[string][]float64{}, map[string][]float64{}
	for _, k := range []string{"csi", "image"} {
		for _, p := range warmPhases[k] {
			if added, started, last := p.at("kubelet: pod added (SyncLoop ADD)"), p.at("container started"), p.at("last byte read"); added > 0 && started > 0 {
				starting[k] = append(starting[k], started-added)
				reading[k] = append(reading[k], last-started)
			}
		}
	}
	fmt.Printf("warm, in two parts (medians): kubelet adds the pod → container started: (a) %.2f s, (b) %.2f s = %.2fx; container started → last byte read: (a) %.2f s, (b) %.2f s = %.2fx\n",
		med(starting, "csi"), med(starting, "image"), med(starting, "csi")/med(starting, "image"),
		med(reading, "csi"), med(reading, "image"), med(reading, "csi")/med(reading, "image"))
	fmt.Printf("  runs: start %s; read %s\n", samples(starting), samples(reading))
	fmt.Printf("the same shards read from the node, no pod (page cache dropped, alternating, %d each): (a) the cache's blobs %.2f s, (b) containerd's snapshot %.2f s = %.2fx; runs: %s\n",
		len(disk["csi"]), med(disk, "csi"), med(disk, "image"), med(disk, "csi")/med(disk, "image"), samples(disk))
	fmt.Println("\nwhere the cold time goes: seconds after `kubectl apply`, median over the cold runs")
	printBreakdown("(a) CSI", phases["csi"])
	printBreakdown("(b) image", phases["image"])
	fmt.Println("\nwarm, median over the warm runs")
	printBreakdown("(a) CSI", warmPhases["csi"])
	printBreakdown("(b) image", warmPhases["image"])
}

// makeCold empties what the variant would find on the node: the driver's cache (its pod stopped meanwhile), or
// the image in containerd. The page cache is dropped by measure.
func (b *bench) makeCold(v string) {
	switch v {
	case "csi":
		b.resetDriver()
	case "image":
		b.removeImage()
	}
}

// resetDriver stops the node plugin (a nodeSelector no node has), empties its cache directory on the host and
// starts it again, waiting until the kubelet has it registered.
func (b *bench) resetDriver() {
	t, c := b.t, b.c
	off := `[{"op":"add","path":"/spec/template/spec/nodeSelector/modelpack-bench-off","value":"true"}]`
	on := `[{"op":"remove","path":"/spec/template/spec/nodeSelector/modelpack-bench-off"}]`
	c.Kubectl(t, "-n", harness.Namespace, "patch", "daemonset", "modelpack-node", "--type=json", "-p", off)
	restored := false
	t.Cleanup(func() {
		if !restored {
			c.Run("-n", harness.Namespace, "patch", "daemonset", "modelpack-node", "--type=json", "-p", on)
		}
	})
	waitFor(t, "the node plugin to stop", 2*time.Minute, func() bool {
		out, err := c.Run("-n", harness.Namespace, "get", "pods", "-l", "app.kubernetes.io/component=node", "-o", "name")
		return err == nil && strings.TrimSpace(out) == ""
	})
	cacheDir := filepath.Join(c.Dir, "node-cache")
	entries, err := os.ReadDir(cacheDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(cacheDir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	c.Kubectl(t, "-n", harness.Namespace, "patch", "daemonset", "modelpack-node", "--type=json", "-p", on)
	restored = true
	c.Kubectl(t, "-n", harness.Namespace, "rollout", "status", "daemonset/modelpack-node", "--timeout=180s")
	c.WaitDriverRegistered(t, 2*time.Minute)
	waitFor(t, "the driver's metrics", time.Minute, func() bool {
		out, err := c.Run("get", "--raw", "/readyz")
		return err == nil && out != "" && httpOK("http://127.0.0.1:29808/healthz")
	})
}

// removeImage deletes the weights image from containerd, content and snapshots included.
func (b *bench) removeImage() {
	ctr := func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(b.root, "bin", "k8s", "ctr"), append([]string{"-a",
			filepath.Join(b.c.Dir, "containerd", "containerd.sock"), "-n", "k8s.io"}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := ctr("images", "ls", "-q")
	if err != nil {
		b.t.Fatalf("ctr images ls: %v\n%s", err, out)
	}
	name := strings.SplitN(b.imageRef, "@", 2)[0]
	for _, img := range strings.Fields(out) {
		if strings.HasPrefix(img, name) {
			if out, err := ctr("images", "rm", "--sync", img); err != nil {
				b.t.Fatalf("ctr images rm %s: %v\n%s", img, err, out)
			}
		}
	}
	// Removing the image leaves its layer and unpacked snapshot behind (held for the image volume), and the next
	// pull would find both: delete them by name. The layer is an uncompressed tar, so its digest is its diff id and,
	// as the only layer, the snapshot's chain id.
	m, _ := b.c.Manifest(b.t, "bench/weights-image", "v1")
	for _, l := range m.Layers {
		if out, err := ctr("snapshots", "rm", l.Digest); err != nil && !strings.Contains(out, "not found") {
			b.t.Fatalf("ctr snapshots rm %s: %v\n%s", l.Digest, err, out)
		}
		if out, err := ctr("content", "rm", l.Digest); err != nil && !strings.Contains(out, "not found") {
			b.t.Fatalf("ctr content rm %s: %v\n%s", l.Digest, err, out)
		}
		if out, _ := ctr("content", "ls", "-q"); strings.Contains(out, l.Digest) {
			b.t.Fatalf("the weights layer %s stays in containerd's content store after its removal", l.Digest)
		}
		if out, _ := ctr("snapshots", "ls"); strings.Contains(out, l.Digest) {
			b.t.Fatalf("the weights layer's snapshot stays after its removal:\n%s", out)
		}
	}
	// Removing content drops its record; the file stays until containerd's garbage collection, and a pull finds it
	// there and reads nothing from the registry: 6 of the 10 "cold" native pulls of two runs on 2026-12-02 read 0
	// bytes (containerd's log). Deleting a lease with --sync runs the collection before returning.
	if out, err := ctr("leases", "create", "--id", "bench-gc"); err != nil {
		b.t.Fatalf("ctr leases create: %v\n%s", err, out)
	}
	if out, err := ctr("leases", "rm", "--sync", "bench-gc"); err != nil {
		b.t.Fatalf("ctr leases rm --sync: %v\n%s", err, out)
	}
	for _, l := range m.Layers {
		blob := filepath.Join(b.c.Dir, "containerd", "root", "io.containerd.content.v1.content", "blobs", strings.Replace(l.Digest, ":", "/", 1))
		if _, err := os.Stat(blob); !errors.Is(err, fs.ErrNotExist) {
			b.t.Fatalf("the weights layer's file %s stays on disk after containerd's garbage collection (%v)", blob, err)
		}
	}
}

// result is one measured pod (or curl).
type result struct {
	last   float64    // seconds from apply to the last byte read
	phases *breakdown // nil for (c) and curl
}

// readScript reads every file of the model and prints the host-shared monotonic clock (/proc/uptime, 10 ms)
// when the container starts and when it has read the last byte.
const readScript = `echo "start $(cut -d" " -f1 /proc/uptime)"; cat $(find /model -type f) > /dev/null; echo "done $(cut -d" " -f1 /proc/uptime)"`

// measure starts one pod of variant v (or runs curl) with the page cache dropped and returns its times.
func (b *bench) measure(v string) result {
	dropCaches(b.t)
	return b.start(v)
}

// evictModel drops the model's files from the page cache and nothing else: every file of 64 MiB or more in the
// driver's cache and in containerd's content and snapshots (the model's shards; no binary of the runtime is that
// large).
func (b *bench) evictModel() {
	for _, root := range []string{filepath.Join(b.c.Dir, "node-cache"), filepath.Join(b.c.Dir, "containerd", "root")} {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			if fi, err := d.Info(); err == nil && fi.Size() >= 64<<20 {
				testenv.EvictPages(b.t, p)
			}
			return nil
		})
	}
}

// shardFiles are where the node keeps the model's files of 64 MiB or more for each warm variant: the driver's
// cache blobs (a layer is one file) and the files of containerd's unpacked snapshot of the image's layer.
func (b *bench) shardFiles() map[string][]string {
	sets := map[string][]string{}
	for _, l := range b.layers {
		dgst, path, _ := strings.Cut(l, "=")
		blob := filepath.Join(b.c.Dir, "node-cache", "cache", "blobs", strings.Replace(dgst, ":", "/", 1))
		fi, err := os.Stat(blob)
		if err != nil {
			b.t.Fatal(err)
		}
		if fi.Size() < 64<<20 {
			continue
		}
		snaps, _ := filepath.Glob(filepath.Join(b.c.Dir, "containerd", "root", "io.containerd.snapshotter.v1.overlayfs", "snapshots", "*", "fs", "model", path))
		if len(snaps) != 1 {
			b.t.Fatalf("disk A/B: want one unpacked copy of %s in containerd's snapshots, found %v", path, snaps)
		}
		sets["csi"] = append(sets["csi"], blob)
		sets["image"] = append(sets["image"], snaps[0])
	}
	return sets
}

// diskAB reads, from the node with no pod, the model's shards as each warm variant finds them on disk — the
// driver's cache blobs and containerd's unpacked snapshot — the page cache dropped before each read, alternating
// which goes first: the same disk reads a warm pod makes, without Kubernetes. The seconds per read, per variant.
func (b *bench) diskAB(pairs int) map[string][]float64 {
	sets := b.shardFiles()
	if len(sets["csi"]) == 0 {
		b.t.Fatalf("disk A/B: the model has no file of 64 MiB or more")
	}
	out := map[string][]float64{}
	buf := make([]byte, 1<<20)
	for i := range pairs {
		for _, v := range stats.Rotated(variants[:2], i) {
			dropCaches(b.t)
			t0 := time.Now()
			for _, p := range sets[v.key] {
				f, err := os.Open(p)
				if err != nil {
					b.t.Fatal(err)
				}
				_, err = io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, buf)
				f.Close()
				if err != nil {
					b.t.Fatal(err)
				}
			}
			out[v.key] = append(out[v.key], time.Since(t0).Seconds())
		}
	}
	return out
}

// start starts one pod of variant v (or runs curl) as the node is and returns its times.
func (b *bench) start(v string) result {
	t, c := b.t, b.c
	if v == "curl" {
		return result{last: b.curl()}
	}
	b.n++
	kind, _, _ := strings.Cut(v, ":")
	name := fmt.Sprintf("bench-%s-%d", kind, b.n)
	manifest := b.pod(name, v, 0)
	t0, up0 := time.Now(), uptime(t)
	if _, err := c.RunInput(manifest, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	applied := time.Now()
	t.Cleanup(func() { c.Run("delete", "pod", name, "--ignore-not-found", "--wait=true", "--timeout=120s") })
	m := readMarks(t, name, 1, up0)[name]
	c.WaitPhase(t, "default", name, corev1.PodSucceeded, podTimeout)
	start, done := m[0], m[1]
	r := result{last: done}
	switch v {
	case "csi":
		r.phases = b.csiPhases(t0, name)
		b.trace(t0, name)
	case "image":
		r.phases = b.imagePhases(t0, name)
	}
	if r.phases != nil {
		r.phases.phases = append([]phase{{"kubectl apply returned", applied.Sub(t0).Seconds()}}, r.phases.phases...)
		r.phases.phases = append(r.phases.phases, phase{"container started", start}, phase{"last byte read", done})
	}
	c.Delete(t, "default", "pod/"+name)
	return r
}

// pod renders the pod of variant v; with replicas > 0 a Deployment of that many, whose pods restart and sleep
// after reading.
func (b *bench) pod(name, v string, replicas int) string {
	script, restart := readScript, "Never"
	if b.readAfter != "" {
		script = "sleep " + b.readAfter + "; " + script
	}
	if replicas > 0 {
		script, restart = readScript+"; exec sleep 3600", "Always"
	}
	var vol map[string]any
	spec := map[string]any{
		"nodeName":                      b.c.Node,
		"hostNetwork":                   true,
		"automountServiceAccountToken":  false,
		"restartPolicy":                 restart,
		"terminationGracePeriodSeconds": 1,
	}
	switch v {
	case "csi":
		vol = map[string]any{"csi": map[string]any{"driver": "modelpack.csi.dev", "readOnly": true,
			"volumeAttributes": map[string]string{"reference": b.modelRef}}}
	case "image":
		vol = map[string]any{"image": map[string]any{"reference": b.imageRef, "pullPolicy": "IfNotPresent"}}
	case "init":
		vol = map[string]any{"emptyDir": map[string]any{}}
		dl := "cd /model"
		for _, l := range b.layers {
			dgst, path, _ := strings.Cut(l, "=")
			dl += fmt.Sprintf(" && mkdir -p $(dirname %s) && wget -q -O %s http://%s/v2/%s/blobs/%s", path, path, b.c.Registry, b.repo, dgst)
		}
		spec["initContainers"] = []map[string]any{{"name": "download", "image": b.c.Busybox,
			"command": []string{"/bin/sh", "-c", dl}, "volumeMounts": []map[string]any{{"name": "model", "mountPath": "/model"}}}}
	default:
		if strings.HasPrefix(v, "csi:") { // the CSI volume of another reference
			vol = map[string]any{"csi": map[string]any{"driver": "modelpack.csi.dev", "readOnly": true,
				"volumeAttributes": map[string]string{"reference": strings.TrimPrefix(v, "csi:")}}}
		} else {
			panic("unknown variant " + v)
		}
	}
	vol["name"] = "model"
	spec["volumes"] = []map[string]any{vol}
	spec["containers"] = []map[string]any{{"name": "c", "image": b.c.Busybox, "imagePullPolicy": "IfNotPresent",
		"command":      []string{"/bin/sh", "-c", script},
		"volumeMounts": []map[string]any{{"name": "model", "mountPath": "/model", "readOnly": true}}}}
	obj := map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": name, "namespace": "default"}, "spec": spec}
	if replicas > 0 {
		labels := map[string]string{"app": name}
		obj = map[string]any{"apiVersion": "apps/v1", "kind": "Deployment",
			"metadata": map[string]any{"name": name, "namespace": "default"},
			"spec": map[string]any{"replicas": replicas, "selector": map[string]any{"matchLabels": labels},
				"template": map[string]any{"metadata": map[string]any{"labels": labels}, "spec": spec}}}
	}
	out, err := json.Marshal(obj)
	if err != nil {
		panic(err)
	}
	return string(out)
}

// curl fetches every blob of the model at once, each into a file, and returns the seconds it took.
func (b *bench) curl() float64 {
	dir, err := os.MkdirTemp(b.scratch, "curl")
	if err != nil {
		b.t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	var cmds []*exec.Cmd
	for i, l := range b.layers {
		dgst, _, _ := strings.Cut(l, "=")
		cmd := exec.Command("curl", "-fsS", "-o", filepath.Join(dir, strconv.Itoa(i)),
			fmt.Sprintf("http://%s/v2/%s/blobs/%s", b.c.Registry, b.repo, dgst))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			b.t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			b.t.Fatalf("curl: %v", err)
		}
	}
	return time.Since(start).Seconds()
}

// readMarks waits until want pods whose names start with prefix have read their model, and returns each one's
// readScript marks (started, read the last byte) in seconds after up0, by pod. It reads the logs from the node's files
// every 100 ms: a kubectl per poll took CPU from the pods it measured. Marks from before up0 are an earlier pod's
// whose log the kubelet has not removed yet.
func readMarks(t *tb, prefix string, want int, up0 float64) map[string][2]float64 {
	marks := map[string][2]float64{}
	for deadline := time.Now().Add(podTimeout); ; time.Sleep(100 * time.Millisecond) {
		for pod, log := range harness.NodeLogs(t, "default", prefix, "c") {
			if start, done, ok := clockMarks(log); ok && start >= up0 {
				marks[pod] = [2]float64{start - up0, done - up0}
			}
		}
		if len(marks) >= want {
			return marks
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %d pods %s* to read their model; read: %v", podTimeout, want, prefix, marks)
		}
	}
}

// clockMarks reads readScript's start and done marks from a container log.
func clockMarks(log string) (start, done float64, ok bool) {
	var seen int
	for _, line := range strings.Split(log, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "start":
			start, seen = v, seen|1
		case "done":
			done, seen = v, seen|2
		}
	}
	return start, done, seen == 3
}

func uptime(t *tb) float64 {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// dropCaches writes back dirty pages and drops the page cache, so cold means a cold disk too.
func dropCaches(t *tb) {
	syscall.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		t.Fatalf("drop the page cache (the bench runs as root): %v", err)
	}
}

// pollEvery is the time between two polls of the bench's kubectl waits (driver restarts, flush records, prepull).
// A kubectl is a process and an API request, taking CPU from whatever else runs on two cores; the waits inside a
// measured start read the node's log files instead (readMarks).
const pollEvery = 1500 * time.Millisecond

func waitFor(t *tb, what string, timeout time.Duration, ok func() bool) {
	for deadline := time.Now().Add(timeout); !ok(); time.Sleep(pollEvery) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
	}
}

func envInt(t *tb, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a whole number ≥ 1", name, s)
	}
	return n
}

func samples(m map[string][]float64) string {
	var parts []string
	for _, v := range variants {
		if len(m[v.key]) == 0 {
			continue
		}
		var xs []string
		for _, x := range m[v.key] {
			xs = append(xs, fmt.Sprintf("%.2f", x))
		}
		parts = append(parts, v.key+" "+strings.Join(xs, "/"))
	}
	return strings.Join(parts, ", ")
}
