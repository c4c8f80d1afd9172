//go:build cluster

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
	stats "github.com/modelpack/modelpack/internal/bench"
)

// A breakdown is when each step of one pod's start happened, in seconds after `kubectl apply`, in order, with
// notes (counts, sizes) beside.
type breakdown struct {
	phases []phase
	notes  []string
}

type phase struct {
	label string
	at    float64
}

func (b *breakdown) add(label string, at time.Time, t0 time.Time) {
	if !at.IsZero() {
		b.phases = append(b.phases, phase{label, at.Sub(t0).Seconds()})
	}
}

// at is when the step labelled l happened, 0 if it was not seen.
func (b *breakdown) at(l string) float64 {
	for _, p := range b.phases {
		if p.label == l {
			return p.at
		}
	}
	return 0
}

// printBreakdown prints, per step, the median over runs of when it happened and the gap to the step before.
func printBreakdown(title string, runs []*breakdown) {
	if len(runs) == 0 {
		return
	}
	fmt.Printf("%s\n", title)
	var order []string
	at := map[string][]float64{}
	for _, r := range runs {
		for _, p := range r.phases {
			if _, ok := at[p.label]; !ok {
				order = append(order, p.label)
			}
			at[p.label] = append(at[p.label], p.at)
		}
	}
	prev := 0.0
	for _, l := range order {
		m := stats.Median(at[l])
		fmt.Printf("  %-52s %7.2f s  %+7.2f s\n", l, m, m-prev)
		prev = m
	}
	for i, r := range runs {
		for _, n := range r.notes {
			fmt.Printf("  run %d: %s\n", i+1, n)
		}
	}
}

// driverRecord is one of the driver's phase log records (csidriver/phases.go, the cache's blob record).
type driverRecord struct {
	Time      time.Time     `json:"time"`
	Msg       string        `json:"msg"`
	Phase     string        `json:"phase"`
	Method    string        `json:"method"`
	Code      string        `json:"code"`
	Start     time.Time     `json:"start"`
	Duration  time.Duration `json:"duration"`
	Size      int64         `json:"size"`
	What      string        `json:"what"`
	FirstByte time.Time     `json:"firstByte"`
	Committed time.Time     `json:"committed"`
}

func (r driverRecord) end() time.Time { return r.Start.Add(r.Duration) }

// driverRecords are the driver's phase records of calls and steps that started after t0.
func (b *bench) driverRecords(t0 time.Time) []driverRecord {
	out, err := b.c.Run("-n", harness.Namespace, "logs", "-l", "app.kubernetes.io/component=node", "-c", "modelpack",
		"--tail=-1", "--since-time="+t0.Add(-time.Second).UTC().Format(time.RFC3339))
	if err != nil {
		b.t.Fatal(err)
	}
	var recs []driverRecord
	for _, line := range strings.Split(out, "\n") {
		var r driverRecord
		if json.Unmarshal([]byte(line), &r) == nil && r.Msg == "phase" && !r.Start.Before(t0) {
			recs = append(recs, r)
		}
	}
	return recs
}

// flushWindow waits for the driver's record of the background flush of blobs that began after t0 (a pull's flush
// starts cas.FlushDelay after its last commit and is logged when it ends) and returns when it began and ended, in
// seconds after t0.
func (b *bench) flushWindow(t0 time.Time) (began, ended float64) {
	var flush driverRecord
	waitFor(b.t, "the background flush of the model's blobs", podTimeout, func() bool {
		for _, r := range b.driverRecords(t0) {
			if r.Phase == "flush" && r.What == "blobs" {
				flush = r
				return true
			}
		}
		return false
	})
	return flush.Start.Sub(t0).Seconds(), flush.end().Sub(t0).Seconds()
}

// csiPhases reads the driver's phase records since t0 and the kubelet's log for the pod.
func (b *bench) csiPhases(t0 time.Time, pod string) *breakdown {
	recs := b.driverRecords(t0)
	first := func(ph string) (driverRecord, bool) {
		for _, r := range recs {
			if r.Phase == ph {
				return r, true
			}
		}
		return driverRecord{}, false
	}
	bd := &breakdown{}
	kubelet := b.kubeletTimes(t0, pod)
	bd.add("kubelet: pod added (SyncLoop ADD)", kubelet["add"], t0)
	var calls, aborted int
	var firstCall, okEnd time.Time
	for _, r := range recs {
		if r.Phase != "call" || r.Method != "NodePublishVolume" {
			continue
		}
		calls++
		if firstCall.IsZero() {
			firstCall = r.Start
		}
		switch r.Code {
		case "Aborted":
			aborted++
		case "OK":
			okEnd = r.end()
		}
	}
	bd.add("driver: first NodePublish call", firstCall, t0)
	if r, ok := first("resolve"); ok {
		bd.add("driver: tag/digest resolved (HEAD manifest)", r.end(), t0)
	}
	if r, ok := first("verify"); ok {
		bd.add("driver: signature check done", r.end(), t0)
	}
	var blobStart, firstByte, lastCommit time.Time
	var blobs int
	var bytes int64
	for _, r := range recs {
		if r.Phase != "blob" {
			continue
		}
		blobs++
		bytes += r.Size
		if blobStart.IsZero() || r.Start.Before(blobStart) {
			blobStart = r.Start
		}
		if firstByte.IsZero() || r.FirstByte.Before(firstByte) {
			firstByte = r.FirstByte
		}
		if r.Committed.After(lastCommit) {
			lastCommit = r.Committed
		}
	}
	if r, ok := first("pull"); ok {
		bd.add("driver: pull started", r.Start, t0)
		bd.add("driver: manifest+config in, blob GETs sent", blobStart, t0)
		bd.add("driver: first blob byte", firstByte, t0)
		bd.add("driver: last blob committed", lastCommit, t0)
		bd.add("driver: pull done", r.end(), t0)
	}
	if r, ok := first("view"); ok {
		bd.add("driver: view built", r.end(), t0)
	}
	bd.add("driver: NodePublish answered OK (mounted)", okEnd, t0)
	bd.add("kubelet: volume set up", kubelet["setup"], t0)
	b.sandbox(bd, t0, pod)
	bd.notes = append(bd.notes, fmt.Sprintf("NodePublish calls %d (ABORTED %d); %d blobs, %s in %.2f s from the first GET; %s",
		calls, aborted, blobs, mib(bytes), lastCommit.Sub(blobStart).Seconds(), driverMemory()))
	return bd
}

// imagePhases reads containerd's and the kubelet's logs for the pod of (b).
func (b *bench) imagePhases(t0 time.Time, pod string) *breakdown {
	bd := &breakdown{}
	kubelet := b.kubeletTimes(t0, pod)
	bd.add("kubelet: pod added (SyncLoop ADD)", kubelet["add"], t0)
	var pullStart, pullEnd time.Time
	read := ""
	name := strings.SplitN(b.imageRef, "@", 2)[0]
	b.containerdLines(t0, func(at time.Time, msg string) {
		if strings.Contains(msg, `PullImage \"`+b.imageRef) || strings.Contains(msg, `PullImage \"`+name) {
			if strings.Contains(msg, "returns image reference") {
				pullEnd = at
			} else if pullStart.IsZero() {
				pullStart = at
			}
		}
		// Whether the pull fetched the layer or found it: a cold pull must read the whole layer.
		if _, after, ok := strings.Cut(msg, "stop pulling image "+name); ok {
			if _, n, ok := strings.Cut(after, "bytes read="); ok {
				read = strings.Trim(n, `"`)
			}
		}
	})
	b.sandbox(bd, t0, pod)
	bd.add("containerd: image pull started", pullStart, t0)
	bd.add("containerd: image pulled and unpacked", pullEnd, t0)
	if read != "" {
		bd.notes = append(bd.notes, "containerd's pull read "+read+" bytes from the registry")
	}
	return bd
}

// klogTime matches the kubelet's klog header: I1201 23:59:59.123456.
var klogTime = regexp.MustCompile(`^[IWE](\d{4} \d{2}:\d{2}:\d{2}\.\d{6})`)

// kubeletTimes finds, in the kubelet's log after t0, when it added the pod and when it had the volume set up.
func (b *bench) kubeletTimes(t0 time.Time, pod string) map[string]time.Time {
	found := map[string]time.Time{}
	scanLines(b.t, filepath.Join(b.c.Dir, "logs", "kubelet.log"), func(line string) {
		m := klogTime.FindStringSubmatch(line)
		if m == nil || !strings.Contains(line, "default/"+pod) && !strings.Contains(line, `pod="default/`+pod) {
			return
		}
		at, err := time.ParseInLocation("0102 15:04:05.000000", m[1], time.Local)
		if err != nil {
			return
		}
		at = at.AddDate(t0.Year(), 0, 0)
		if at.Before(t0.Add(-time.Second)) {
			return
		}
		key := ""
		switch {
		case strings.Contains(line, `"SyncLoop ADD"`):
			key = "add"
		case strings.Contains(line, `MountVolume.SetUp succeeded for volume \"model\"`):
			key = "setup"
		}
		if _, seen := found[key]; key != "" && !seen {
			found[key] = at
		}
	})
	return found
}

// sandbox adds the runtime's steps for the pod: when the kubelet asked containerd for its sandbox (after its
// volumes are set up), when containerd had it running, and when the container was asked for, created and started.
func (b *bench) sandbox(bd *breakdown, t0 time.Time, pod string) {
	rt := b.runtimeTimes(t0, pod)
	bd.add("containerd: sandbox asked for", rt.sandboxAsked, t0)
	bd.add("containerd: sandbox running", rt.sandboxReady, t0)
	bd.add("containerd: container asked for", rt.createAsked, t0)
	bd.add("containerd: container created", rt.created, t0)
	bd.add("containerd: container start returned", rt.started, t0)
}

func (b *bench) sandboxTimes(t0 time.Time, pod string) (asked, ready time.Time) {
	rt := b.runtimeTimes(t0, pod)
	return rt.sandboxAsked, rt.sandboxReady
}

// runtimeSteps are containerd's CRI steps for one pod, from its log.
type runtimeSteps struct {
	sandboxAsked, sandboxReady, createAsked, created, started time.Time
}

// containerd's CRI log quotes ids inside msg="…", so they appear as \"id\".
var (
	sandboxID   = regexp.MustCompile(`returns sandbox id \\"([0-9a-f]+)\\"`)
	containerIn = regexp.MustCompile(`CreateContainer within sandbox \\"([0-9a-f]+)\\"`)
	containerID = regexp.MustCompile(`returns container id \\"([0-9a-f]+)\\"`)
	startOf     = regexp.MustCompile(`StartContainer for \\"([0-9a-f]+)\\"`)
)

func (b *bench) runtimeTimes(t0 time.Time, pod string) runtimeSteps {
	var rt runtimeSteps
	var sandbox, container string
	set := func(at *time.Time, when time.Time) {
		if at.IsZero() {
			*at = when
		}
	}
	// containerd logs a request twice: asked for, then answered with the new object's ID.
	askedOrDone := func(msg string, answer *regexp.Regexp, asked, done *time.Time, when time.Time, id *string) {
		if m := answer.FindStringSubmatch(msg); m != nil {
			set(done, when)
			*id = m[1]
		} else {
			set(asked, when)
		}
	}
	b.containerdLines(t0, func(when time.Time, msg string) {
		switch {
		case strings.Contains(msg, "RunPodSandbox for name:\\\""+pod+"\\\""):
			askedOrDone(msg, sandboxID, &rt.sandboxAsked, &rt.sandboxReady, when, &sandbox)
		case sandbox != "" && strings.Contains(msg, "CreateContainer within sandbox"):
			if m := containerIn.FindStringSubmatch(msg); m == nil || m[1] != sandbox {
				return
			}
			askedOrDone(msg, containerID, &rt.createAsked, &rt.created, when, &container)
		case container != "" && strings.Contains(msg, "StartContainer for"):
			if m := startOf.FindStringSubmatch(msg); m != nil && m[1] == container && strings.Contains(msg, "returns successfully") {
				set(&rt.started, when)
			}
		}
	})
	return rt
}

var containerdLine = regexp.MustCompile(`^time="([^"]+)" level=\w+ msg="(.*)"`)

// containerdLines calls f for each of containerd's log messages after t0.
func (b *bench) containerdLines(t0 time.Time, f func(time.Time, string)) {
	scanLines(b.t, filepath.Join(b.c.Dir, "logs", "containerd.log"), func(line string) {
		m := containerdLine.FindStringSubmatch(line)
		if m == nil {
			return
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil || at.Before(t0) {
			return
		}
		f(at, m[2])
	})
}

// trace prints the kubelet's and containerd's log lines about the pod after t0 (BENCH_TRACE=1), to find steps
// the breakdown does not name yet.
func (b *bench) trace(t0 time.Time, pod string) {
	if os.Getenv("BENCH_TRACE") != "1" {
		return
	}
	for _, f := range []string{"kubelet.log", "containerd.log"} {
		scanLines(b.t, filepath.Join(b.c.Dir, "logs", f), func(line string) {
			if strings.Contains(line, pod) {
				fmt.Fprintf(os.Stderr, "trace %s: %s\n", f, line)
			}
		})
	}
}

func scanLines(t *tb, path string, f func(string)) {
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	s := bufio.NewScanner(fh)
	s.Buffer(make([]byte, 1<<20), 16<<20)
	for s.Scan() {
		f(s.Text())
	}
}

// driverMemory is the node plugin container's memory cgroup (v1): limit, peak and how often it hit the limit —
// the cache's page cache is charged to it.
func driverMemory() string {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmd, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(cmd), "csi-driver\x00") {
			continue
		}
		cg, err := os.ReadFile(filepath.Join(filepath.Dir(p), "cgroup"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(cg), "\n") {
			f := strings.SplitN(line, ":", 3)
			if len(f) != 3 || !strings.Contains(","+f[1]+",", ",memory,") {
				continue
			}
			dir := filepath.Join("/sys/fs/cgroup/memory", f[2])
			read := func(name string) string {
				b, _ := os.ReadFile(filepath.Join(dir, name))
				return strings.TrimSpace(string(b))
			}
			return fmt.Sprintf("driver memory cgroup: limit %s, peak %s, failcnt %s",
				mibS(read("memory.limit_in_bytes")), mibS(read("memory.max_usage_in_bytes")), read("memory.failcnt"))
		}
	}
	return "driver memory cgroup: not found"
}

func mib(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }

func mibS(s string) string {
	var n int64
	if _, err := fmt.Sscan(s, &n); err != nil {
		return s
	}
	if n >= 1<<62 { // cgroup v1's "no limit"
		return "none"
	}
	return mib(n)
}

func httpOK(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
