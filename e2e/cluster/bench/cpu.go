//go:build cluster

package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	stats "github.com/modelpack/modelpack/internal/bench"
)

// cpuGroups are the node's parts a window's CPU time is charged to, by process name. The single-node cluster runs
// its components as host processes, so their names tell them apart. A process's time includes its waited-for
// children's (runc's lands on its shim, cat's on the container's shell).
var cpuGroups = []struct{ name, comms string }{
	{"modelpack (node plugin, prepull)", "modelpack"},
	{"registry", "registry"},
	{"containerd, shims, runc", "containerd containerd-shim containerd-shim-runc-v2 runc runc:[0:PARENT] runc:[1:CHILD] runc:[2:INIT]"},
	{"kubelet", "kubelet"},
	{"control plane", "kube-apiserver etcd kube-controller kube-scheduler"},
	{"the pods' processes", "sh cat sleep pause"},
	{"the bench (kubectl, go)", "bench kubectl go"},
	{kernelThreads, ""}, // children of kthreadd
	{otherProcs, ""},
}

const (
	kernelThreads = "kernel threads"
	otherProcs    = "other"
)

// groupOfComm is cpuGroups by process name.
var groupOfComm = func() map[string]string {
	m := map[string]string{}
	for _, g := range cpuGroups {
		for _, comm := range strings.Fields(g.comms) {
			m[comm] = g.name
		}
	}
	return m
}()

func cpuGroup(comm string, ppid int) string {
	if g, ok := groupOfComm[comm]; ok {
		return g
	}
	if ppid == 2 {
		return kernelThreads
	}
	return otherProcs
}

// A cpuSample is the node's CPU time at one moment: every process's, and all cores' busy time.
type cpuSample struct {
	up    float64             // the node's uptime, s
	busy  float64             // CPU-seconds the cores were busy since boot (/proc/stat: all but idle and iowait)
	procs map[int]sampledProc // by PID
}

type sampledProc struct {
	group string
	secs  float64 // utime + stime + cutime + cstime
}

// cpuSampler reads /proc every 100 ms until stopped: a few milliseconds of one core per read, which the
// experiment that uses it accepts and the default bench does not pay.
type cpuSampler struct {
	mu      sync.Mutex
	samples []cpuSample
	spent   time.Duration // reading /proc, part of "the bench"
	open    map[int]*os.File
	buf     []byte
	stop    chan struct{}
	done    chan struct{}
}

func startCPUSampler() *cpuSampler {
	s := &cpuSampler{stop: make(chan struct{}), done: make(chan struct{}), open: map[int]*os.File{}, buf: make([]byte, 4096)}
	go func() {
		defer close(s.done)
		defer func() {
			for _, f := range s.open {
				f.Close()
			}
		}()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			t0 := time.Now()
			smp, err := s.sample()
			s.mu.Lock()
			if err == nil {
				s.samples = append(s.samples, smp)
			}
			s.spent += time.Since(t0)
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *cpuSampler) Stop() { close(s.stop); <-s.done }

// cost is the share of one core the sampling took: an upper bound, as a read that waits is counted whole.
func (s *cpuSampler) cost() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.samples) < 2 {
		return 0
	}
	return s.spent.Seconds() / (s.samples[len(s.samples)-1].up - s.samples[0].up)
}

const clockTick = 100.0 // USER_HZ: 100 on every Linux architecture Kubernetes runs on

// sample reads the node's CPU time now. It keeps each process's stat file open between samples and reads it
// again in place: globbing and opening a few hundred files ten times a second took a quarter of a core.
func (s *cpuSampler) sample() (cpuSample, error) {
	up, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return cpuSample{}, err
	}
	smp := cpuSample{procs: map[int]sampledProc{}}
	if smp.up, err = strconv.ParseFloat(strings.Fields(string(up))[0], 64); err != nil {
		return cpuSample{}, err
	}
	st, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuSample{}, err
	}
	line, _, _ := bytes.Cut(st, []byte("\n"))
	for i, f := range strings.Fields(string(line))[1:] {
		if v, err := strconv.ParseFloat(f, 64); err == nil && i != 3 && i != 4 && i < 8 { // idle, iowait; guest is in user
			smp.busy += v / clockTick
		}
	}
	dir, err := os.Open("/proc")
	if err != nil {
		return cpuSample{}, err
	}
	names, err := dir.Readdirnames(-1)
	dir.Close()
	if err != nil {
		return cpuSample{}, err
	}
	seen := map[int]bool{}
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		seen[pid] = true
		f := s.open[pid]
		if f == nil {
			if f, err = os.Open("/proc/" + name + "/stat"); err != nil {
				continue // exited since the listing
			}
			s.open[pid] = f
		}
		n, err := f.ReadAt(s.buf, 0)
		if n == 0 && err != nil {
			continue
		}
		if p, ok := parseStat(s.buf[:n]); ok {
			smp.procs[pid] = p
		}
	}
	for pid, f := range s.open {
		if !seen[pid] {
			f.Close()
			delete(s.open, pid)
		}
	}
	return smp, nil
}

// parseStat reads a process's name, parent and CPU time from its /proc/<pid>/stat.
func parseStat(b []byte) (sampledProc, bool) {
	lp, rp := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if lp < 0 || rp < lp {
		return sampledProc{}, false
	}
	f := strings.Fields(string(b[rp+1:])) // state ppid ... utime(12) stime cutime cstime
	if len(f) < 15 {
		return sampledProc{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	var ticks float64
	for _, x := range f[11:15] {
		v, _ := strconv.ParseFloat(x, 64)
		ticks += v
	}
	return sampledProc{group: cpuGroup(string(b[lp+1:rp]), ppid), secs: ticks / clockTick}, true
}

// window charges the CPU time between uptimes from and to to the groups: each process's growth between the last
// sample at or before from and the first at or after to (all of it for a process born in between). It returns
// the window's length too, as the samples bound it.
func (s *cpuSampler) window(from, to float64) (length, busy float64, byGroup map[string]float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := 0
	for i+1 < len(s.samples) && s.samples[i+1].up <= from {
		i++
	}
	j := len(s.samples) - 1
	for j > 0 && s.samples[j-1].up >= to {
		j--
	}
	if len(s.samples) == 0 || j <= i {
		return 0, 0, nil
	}
	a, b := s.samples[i], s.samples[j]
	byGroup = map[string]float64{}
	for pid, p := range b.procs {
		d := p.secs
		if q, ok := a.procs[pid]; ok {
			d -= q.secs
		}
		if d > 0 {
			byGroup[p.group] += d
		}
	}
	return b.up - a.up, b.busy - a.busy, byGroup
}

// fleetCPUExperiment (BENCH_EXPERIMENT=fleetcpu) starts cold Deployments of one replica and of four, rotated,
// BENCH_FLEET_RUNS (4) of each, with the node's CPU time sampled, and charges two windows of each run to the
// node's parts: the download (the first NodePublish call → the last answered) and the start (the last answered →
// the slowest replica's last byte), where four replicas cost more than one. Whose work fills the two cores there
// says what could shorten it.
func (b *bench) fleetCPUExperiment() {
	runs := envInt(b.t, "BENCH_FLEET_RUNS", 4)
	fmt.Printf("\nexperiment: cold Deployments of 1 and 4 replicas, %d of each, the node's CPU time by part (sampled every 100 ms)\n", runs)
	type key struct {
		replicas int
		window   string
	}
	lengths, busy := map[key][]float64{}, map[key][]float64{}
	groups := map[key]map[string][]float64{}
	var cost []float64
	for i := range runs {
		for _, n := range stats.Rotated([]int{1, 4}, i) {
			s := startCPUSampler()
			r := b.deployment(n, true)
			s.Stop()
			cost = append(cost, s.cost())
			windows := []struct {
				name     string
				from, to float64
			}{
				{"download", r.firstCall, stats.Max(r.published)},
				{"start", stats.Max(r.published), r.slowest()},
			}
			for _, w := range windows {
				k := key{n, w.name}
				length, bsy, by := s.window(r.up0+w.from, r.up0+w.to)
				lengths[k] = append(lengths[k], length)
				busy[k] = append(busy[k], bsy)
				if groups[k] == nil {
					groups[k] = map[string][]float64{}
				}
				for _, g := range cpuGroups {
					groups[k][g.name] = append(groups[k][g.name], by[g.name])
				}
			}
			fmt.Printf("  run %d, %d replica(s): slowest last byte %.2f s; download %.2f → %.2f s, start → %.2f s\n",
				i+1, n, r.slowest(), r.firstCall, stats.Max(r.published), r.slowest())
		}
	}
	fmt.Printf("  the sampling itself took %.1f%% of one core (median; in \"the bench\" below)\n", 100*stats.Median(cost))
	for _, w := range []string{"download", "start"} {
		fmt.Printf("  %s window, medians (CPU-seconds):\n", w)
		fmt.Printf("    %-36s %12s %12s\n", "", "1 replica", "4 replicas")
		one, four := key{1, w}, key{4, w}
		fmt.Printf("    %-36s %10.2f s %10.2f s\n", "window length", stats.Median(lengths[one]), stats.Median(lengths[four]))
		fmt.Printf("    %-36s %10.2f   %10.2f   (%.0f%% and %.0f%% of the two cores)\n", "cores busy", stats.Median(busy[one]),
			stats.Median(busy[four]), 50*stats.Median(busy[one])/stats.Median(lengths[one]), 50*stats.Median(busy[four])/stats.Median(lengths[four]))
		for _, g := range cpuGroups {
			fmt.Printf("    %-36s %10.2f   %10.2f\n", g.name, stats.Median(groups[one][g.name]), stats.Median(groups[four][g.name]))
		}
	}
}
