package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelpack/modelpack/internal/bench"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// benchDriver: the CSI driver (needs root: mounts).
//
//   - cold publish: NodePublishVolume of the benchmark model on a fresh driver with an empty node cache, until the
//     mount is usable, side by side with a parallel curl of its blobs (target ≤ 1.15×) and with "download at pod
//     start" (oras pull into a dir, target: ≥ 1.3× the cold publish), medians of RUNS (5) rotated rounds;
//   - peak RSS of the driver during that cold publish (VmHWM);
//   - warm publish p50/p99, each publish a new pod's target, for a 10 MiB model and the benchmark model (target ≈
//     equal, p50 ≤ 20 ms), and for the benchmark model while the cache's background flush of its pull runs (the
//     publishes the driver's modelpack_cache_flushing says overlapped it; target p99 ≤ 50 ms).
//
// BENCH_BASELINE_BIN=/path/to/an/older/modelpack adds its cold publish to every round (before/after in one run).
// DRIVER_WARM_LOG=/path keeps the log of the driver the warm publishes ran against (with DRIVER_LOG_LEVEL=debug:
// each publish's steps, to see which one makes the p99).
func benchDriver(e *env) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root for mounts")
	}
	warmN := envInt("WARM_N", 200)
	runs := envInt("RUNS", 5)
	baseline := os.Getenv("BENCH_BASELINE_BIN")
	d, blobs, err := e.scratch("driver")
	if err != nil {
		return err
	}
	defer os.RemoveAll(d)
	smallDir := filepath.Join(e.work, "model-10m")
	if err := bench.Model(smallDir, testmodel.Spec{Shards: 1, ShardSize: 10 << 20, Seed: 1}); err != nil {
		return err
	}
	smallRef := e.registry.Host + "/bench/model-10m:v1"
	if err := e.push(smallDir, smallRef); err != nil {
		return err
	}
	csi, err := buildCSIClient(d)
	if err != nil {
		return err
	}
	mp, err := exec.LookPath("modelpack")
	if err != nil {
		return err
	}
	weights, err := firstWeights(e.modelDir)
	if err != nil {
		return err
	}
	pods := filepath.Join(d, "pods")
	var drv *driverProc
	stop := func() {
		if drv == nil {
			return
		}
		targets, _ := filepath.Glob(filepath.Join(pods, "*", "mount"))
		for _, tgt := range targets {
			run1(exec.Command(csi, "-endpoint", "unix://"+drv.sock, "unpublish", "-volume-id", "vol-"+filepath.Base(filepath.Dir(tgt)), "-target", tgt))
		}
		drv.stop(d)
		drv = nil
		os.RemoveAll(pods)
	}
	defer stop()
	publish := func(pod, ref string) error { // retrying ABORTED as kubelet does (csiclient)
		return drv.publish(csi, "vol-"+pod, filepath.Join(pods, pod, "mount"), ref)
	}
	curlDir, orasDir := filepath.Join(d, "curl"), filepath.Join(d, "oras")
	blobs.curlAll(curlDir, false) // warm the registry's page cache so the first measured run is not penalised
	os.RemoveAll(curlDir)

	// A cold publish on a fresh driver and an empty cache; the driver's peak RSS goes to rss.
	var rssMax int64
	coldPublish := func(bin, name string, into *[]float64, driverArgs ...string) func() error {
		return func() error {
			root := filepath.Join(d, "root-"+name)
			var err error
			if drv, err = startDriver(bin, root, e.registry.Host, filepath.Join(d, "driver.log"), envOr("DRIVER_LOG_LEVEL", "warn"), false, driverArgs...); err != nil {
				return err
			}
			t, err := bench.Time(func() error { return publish("cold-"+name, e.ref) })
			if err != nil {
				return err
			}
			rssMax = max(rssMax, drv.peakRSSKiB())
			if fi, err := os.Stat(filepath.Join(pods, "cold-"+name, "mount", weights)); err != nil || fi.Size() == 0 {
				return fmt.Errorf("cold publish mounted no weights (%s: %v)", weights, err)
			}
			stop()
			fresh(root) // let the deletion and its discards settle before the next measurement
			*into = append(*into, t)
			return nil
		}
	}
	// The same cold publish under a trust policy that needs no signature but refuses code (allowCode's default):
	// every blob is scanned before the view is made, so the difference is what the scan costs a cold publish.
	scanPolicy := filepath.Join(d, "scan-policy.yaml")
	if err := os.WriteFile(scanPolicy, []byte("default: {mode: enforce, none: true}\n"), 0o644); err != nil {
		return err
	}
	var curlRuns, coldRuns, scanRuns, orasRuns, baseRuns []float64
	for i := 1; i <= runs; i++ {
		paths := []func() error{
			func() error {
				syscall.Sync()
				t, err := bench.Time(func() error { return blobs.curlAll(curlDir, false) })
				curlRuns = append(curlRuns, t)
				fresh(curlDir)
				return err
			},
			coldPublish(mp, strconv.Itoa(i), &coldRuns),
			coldPublish(mp, "scan-"+strconv.Itoa(i), &scanRuns, "--policy", scanPolicy),
			func() error {
				os.RemoveAll(orasDir)
				cmd := exec.Command("oras", "pull", "--plain-http", "-o", orasDir, e.ref)
				cmd.Stdout = io.Discard
				t, err := timed(cmd)
				orasRuns = append(orasRuns, t)
				fresh(orasDir)
				return err
			},
		}
		if baseline != "" {
			paths = append(paths, coldPublish(baseline, "base-"+strconv.Itoa(i), &baseRuns))
		}
		if err := bench.Rotate(i, paths...); err != nil {
			return err
		}
	}
	tCurl, tCold, tOras := bench.Median(curlRuns), bench.Median(coldRuns), bench.Median(orasRuns)

	if drv, err = startDriver(mp, filepath.Join(d, "root"), e.registry.Host, envOr("DRIVER_WARM_LOG", filepath.Join(d, "driver.log")), envOr("DRIVER_LOG_LEVEL", "warn"), false); err != nil {
		return err
	}
	// The small model first: the flusher waits while the big one downloads, so one flush covers both, and the
	// warm publishes of the big model start right after its pull, before that flush.
	if err := errors.Join(publish("small", smallRef), publish("big", e.ref)); err != nil {
		return err
	}
	during, flushSecs, err := warmDuringFlush(csi, drv, e.ref, filepath.Join(d, "warm-flush"))
	if err != nil {
		return err
	}
	warm := func(ref, dir string) (map[string]any, error) {
		var out bytes.Buffer
		cmd := exec.Command(csi, "-endpoint", "unix://"+drv.sock, "bench", "-attr", "reference="+ref, "-dir", dir, "-n", strconv.Itoa(warmN))
		cmd.Stdout = &out
		if err := run1(cmd); err != nil {
			return nil, err
		}
		var m map[string]any
		return m, json.Unmarshal(out.Bytes(), &m)
	}
	warmBig, err := warm(e.ref, filepath.Join(d, "warm-big"))
	if err != nil {
		return err
	}
	warmSmall, err := warm(smallRef, filepath.Join(d, "warm-small"))
	if err != nil {
		return err
	}

	fmt.Printf("driver (%s model, medians of %d interleaved rounds: %s / %s / %s)\n", e.size, runs, bench.Runs(curlRuns), bench.Runs(coldRuns), bench.Runs(orasRuns))
	fmt.Printf("%-44s %8ss\n", fmt.Sprintf("parallel curl of the %d blobs", len(blobs.all())), bench.Secs(tCurl))
	fmt.Printf("%-44s %8ss   %s× curl (target ≤ 1.15×)\n", "cold publish ("+e.size+", empty cache)", bench.Secs(tCold), bench.Ratio(tCold, tCurl))
	tScan := bench.Median(scanRuns)
	fmt.Printf("%-44s %8ss   %s× the cold publish without (runs: %s; target ≈ 1.00×)\n", "cold publish, every blob scanned (allowCode)", bench.Secs(tScan), bench.Ratio(tScan, tCold), bench.Runs(scanRuns))
	fmt.Printf("%-44s %8ss   oras is %s× the cold publish (target ≥ 1.3×)\n", "oras pull into a dir (download at pod start)", bench.Secs(tOras), bench.Ratio(tOras, tCold))
	if baseline != "" {
		tBase := bench.Median(baseRuns)
		fmt.Printf("%-44s %8ss   %s× curl (runs: %s)\n", "cold publish, baseline "+filepath.Base(filepath.Dir(baseline)), bench.Secs(tBase), bench.Ratio(tBase, tCurl), bench.Runs(baseRuns))
	}
	fmt.Printf("%-44s %8d MiB\n", "driver peak RSS during the cold publish", rssMax/1024)
	fmt.Printf("%-44s p50 %6v ms  p99 %6v ms  (n=%d)\n", "warm publish, 10 MiB model", warmSmall["p50_ms"], warmSmall["p99_ms"], warmN)
	fmt.Printf("%-44s p50 %6v ms  p99 %6v ms  (n=%d; target p50 ≤ 20 ms, ≈ the 10 MiB figure)\n", "warm publish, "+e.size+" model", warmBig["p50_ms"], warmBig["p99_ms"], warmN)
	fmt.Printf("%-44s p50 %6.3f ms  p99 %6.3f ms  (n=%d during a %.1f s flush; target p99 ≤ 50 ms)\n", "warm publish while that model is flushed", bench.Median(during), percentile(during, 0.99), len(during), flushSecs)
	return nil
}

// warmDuringFlush publishes ref warm, batch after batch, from right after its pull until the cache's background
// flush of it has run (the driver's modelpack_cache_flushing went to 1 and back to 0), and returns the durations
// of the publishes that overlapped the flush, and the flush's length.
func warmDuringFlush(csi string, drv *driverProc, ref, dir string) ([]float64, float64, error) {
	type span struct{ from, to float64 } // Unix ms
	var mu sync.Mutex
	var flushes []span
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		on := false
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			now := float64(time.Now().UnixMicro()) / 1000
			flushing := metricValue("http://"+drv.metrics+"/metrics", "modelpack_cache_flushing") == 1
			mu.Lock()
			switch {
			case flushing && !on:
				flushes = append(flushes, span{now, 0})
			case !flushing && on:
				flushes[len(flushes)-1].to = now
			}
			mu.Unlock()
			on = flushing
		}
	}()
	var samples [][2]float64
	deadline := time.Now().Add(2 * time.Minute)
	for batch := 0; ; batch++ {
		var out bytes.Buffer
		cmd := exec.Command(csi, "-endpoint", "unix://"+drv.sock, "bench", "-attr", "reference="+ref,
			"-dir", filepath.Join(dir, strconv.Itoa(batch)), "-n", "50", "-samples")
		cmd.Stdout = &out
		if err := run1(cmd); err != nil {
			close(stop)
			return nil, 0, err
		}
		var r struct{ Samples [][2]float64 }
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			close(stop)
			return nil, 0, err
		}
		samples = append(samples, r.Samples...)
		mu.Lock()
		done := len(flushes) > 0 && flushes[len(flushes)-1].to != 0
		mu.Unlock()
		if done || time.Now().After(deadline) {
			break
		}
	}
	close(stop)
	<-polled
	var during []float64
	var length float64
	for _, f := range flushes {
		if f.to == 0 {
			return nil, 0, fmt.Errorf("the flush of the model did not end within 2 minutes of warm publishes")
		}
		length += (f.to - f.from) / 1000
		for _, s := range samples {
			if s[0] < f.to && s[0]+s[1] > f.from {
				during = append(during, s[1])
			}
		}
	}
	if len(during) == 0 {
		return nil, 0, fmt.Errorf("no warm publish overlapped a flush (flushes seen: %d)", len(flushes))
	}
	return during, length, nil
}

// metricValue is the value of an unlabelled metric at a Prometheus endpoint, or -1.
func metricValue(url, name string) float64 {
	resp, err := http.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

func percentile(xs []float64, p float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// driverProc is `modelpack csi-driver` running as on a node, with its root, socket and metrics address.
type driverProc struct {
	root, sock, metrics string
	cmd                 *exec.Cmd
}

// startDriver starts bin's csi-driver on an empty root and waits until it answers its health check (and, with
// prepull, until its prepull socket exists). Its log goes to logPath.
func startDriver(bin, root, registry, logPath, logLevel string, prepull bool, args ...string) (*driverProc, error) {
	os.RemoveAll(root)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	metrics, err := freeAddr()
	if err != nil {
		return nil, err
	}
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	p := &driverProc{root: root, sock: filepath.Join(root, "csi.sock"), metrics: metrics}
	p.cmd = exec.Command(bin, "csi-driver", "--endpoint", "unix://"+p.sock, "--node-id", "bench", "--root", root,
		"--metrics-addr", metrics, "--registry-config", filepath.Join(os.Getenv("DOCKER_CONFIG"), "config.json"),
		"--plain-http-registries", registry, "--log-level", logLevel)
	p.cmd.Args = append(p.cmd.Args, args...)
	p.cmd.Stderr = log
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	for range 200 {
		resp, err := http.Get("http://" + metrics + "/healthz")
		if err == nil {
			resp.Body.Close()
			if _, err := os.Stat(filepath.Join(root, "prepull.sock")); resp.StatusCode == http.StatusOK && (!prepull || err == nil) {
				return p, nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.stop(root)
	b, _ := os.ReadFile(logPath)
	return nil, fmt.Errorf("driver did not start: %s", b)
}

// stop detaches whatever is still mounted under dir (deepest first), then stops the driver.
func (p *driverProc) stop(dir string) {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var mounts []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			mounts = append(mounts, f[4])
		}
	}
	slices.Sort(mounts)
	for _, m := range slices.Backward(mounts) {
		syscall.Unmount(m, syscall.MNT_DETACH)
	}
	p.cmd.Process.Kill()
	p.cmd.Wait()
}

// publish publishes ref as volID at target through csiclient (kubelet's side: it retries ABORTED), making the
// pod's directory as kubelet does.
func (p *driverProc) publish(csiclient, volID, target, ref string) error {
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	return run1(exec.Command(csiclient, "-endpoint", "unix://"+p.sock, "publish", "-volume-id", volID, "-target", target,
		"-attr", "reference="+ref, "-timeout", "2m"))
}

// peakRSSKiB is the driver's peak resident set so far (VmHWM).
func (p *driverProc) peakRSSKiB() int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "VmHWM:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// buildCSIClient builds e2e/cmd/csiclient (kubelet's side of CSI) into dir.
func buildCSIClient(dir string) (string, error) {
	bin := filepath.Join(dir, "csiclient")
	return bin, run1(exec.Command("go", "build", "-o", bin, "./e2e/cmd/csiclient"))
}

// firstWeights is the name of the model's first safetensors file, which a usable mount must show non-empty.
func firstWeights(dir string) (string, error) {
	m, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if len(m) == 0 {
		return "", fmt.Errorf("no safetensors file in %s", dir)
	}
	slices.Sort(m)
	return filepath.Base(m[0]), nil
}
