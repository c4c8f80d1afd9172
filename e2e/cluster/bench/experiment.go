//go:build cluster

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
	stats "github.com/modelpack/modelpack/internal/bench"
)

// memoryLimitExperiment (BENCH_EXPERIMENT=memlimit) starts cold CSI pods alternately with the node plugin's
// memory limit as deployed and without one, in one cluster, to measure what the limit costs: the page cache of
// the files the driver writes is charged to its cgroup, so a model larger than the limit is reclaimed as it
// arrives (dirty pages written back on the pull's path), and the pod reads the evicted part again from disk.
func (b *bench) memoryLimitExperiment() {
	t, c := b.t, b.c
	deployed := strings.TrimSpace(c.Kubectl(t, "-n", harness.Namespace, "get", "daemonset", "modelpack-node",
		"-o", "jsonpath={.spec.template.spec.containers[0].resources.limits}"))
	set := func(limits string) {
		c.Kubectl(t, "-n", harness.Namespace, "patch", "daemonset", "modelpack-node", "--type=json", "-p",
			`[{"op":"replace","path":"/spec/template/spec/containers/0/resources/limits","value":`+limits+`}]`)
	}
	t.Cleanup(func() { set(deployed) })
	runs := envInt(t, "BENCH_COLD_RUNS", 3)
	res := map[string][]float64{}
	fmt.Printf("\nexperiment: the node plugin's memory limit (deployed: %s) against none, cold CSI pods alternating\n", deployed)
	for i := range 2 * runs {
		limits, label := deployed, "deployed limit"
		if i%2 == 1 {
			limits, label = "{}", "no limit"
		}
		set(limits)
		b.makeCold("csi")
		t0 := time.Now()
		r := b.measure("csi")
		var pull float64
		for _, rec := range b.driverRecords(t0) {
			if rec.Phase == "pull" {
				pull = rec.Duration.Seconds()
			}
		}
		last := r.phases.phases[len(r.phases.phases)-1].at - r.phases.phases[len(r.phases.phases)-2].at
		fmt.Printf("  %-15s pod %6.2f s  pull %6.2f s  container start → last byte %5.2f s  %s\n", label, r.last, pull, last, r.phases.notes[0])
		res[label] = append(res[label], r.last)
	}
	fmt.Fprintf(os.Stderr, "experiment medians: deployed limit %.2f s, no limit %.2f s\n", stats.Median(res["deployed limit"]), stats.Median(res["no limit"]))
	fmt.Printf("  medians: deployed limit %.2f s, no limit %.2f s\n", stats.Median(res["deployed limit"]), stats.Median(res["no limit"]))
}

// A driverSetting is the node plugin's deployed arguments plus args (nil: as deployed).
type driverSetting struct {
	label string
	args  []string
}

// driverSettings returns a function that redeploys the node plugin with a setting (nothing when it has that one
// already) and waits until the kubelet has it registered; the deployed arguments come back at cleanup. Arguments
// with the prefixes are dropped from the deployed ones first: a run stopped half way may have left its setting.
func (b *bench) driverSettings(prefixes ...string) func(driverSetting) {
	t, c := b.t, b.c
	var deployed []string
	if err := json.Unmarshal([]byte(c.Kubectl(t, "-n", harness.Namespace, "get", "daemonset", "modelpack-node", "-o",
		"jsonpath={.spec.template.spec.containers[0].args}")), &deployed); err != nil {
		t.Fatal(err)
	}
	deployed = slices.DeleteFunc(deployed, func(a string) bool {
		return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(a, p) })
	})
	current := "\x00" // unknown: the first setting is always applied
	set := func(s driverSetting) {
		if s.label == current {
			return
		}
		current = s.label
		args, _ := json.Marshal(append(slices.Clone(deployed), s.args...))
		c.Kubectl(t, "-n", harness.Namespace, "patch", "daemonset", "modelpack-node", "--type=json", "-p",
			`[{"op":"replace","path":"/spec/template/spec/containers/0/args","value":`+string(args)+`}]`)
		c.Kubectl(t, "-n", harness.Namespace, "rollout", "status", "daemonset/modelpack-node", "--timeout=180s")
		c.WaitDriverRegistered(t, 2*time.Minute)
	}
	t.Cleanup(func() { set(driverSetting{label: "as deployed"}) })
	return set
}

// inBlocks runs a block per setting, the settings in their order and then in the reverse (pass 0 and 1), so that
// neither drift over the run nor the order favours one; of a setting's runs, pass 0 takes the odd one.
func inBlocks(settings []driverSetting, runs int, block func(s driverSetting, pass, rounds int)) {
	for pass := range 2 {
		order := slices.Clone(settings)
		if pass == 1 {
			slices.Reverse(order)
		}
		for _, s := range order {
			block(s, pass, (runs+1-pass)/2)
		}
	}
}

// flushDelayExperiment (BENCH_EXPERIMENT=flushdelay) starts cold Deployments of one replica and of four with the
// node plugin's background flush as deployed and with --cache-flush-delay=10s, in blocks, the blocks in one order
// and then in the reverse: whether the flush of the pulled blobs slows the replicas when it begins while they
// start (the four take longer after the mount than the flush delay).
func (b *bench) flushDelayExperiment() {
	settings := []driverSetting{
		{"flush as deployed", nil},
		{"flush after 10s", []string{"--cache-flush-delay=10s"}},
	}
	set := b.driverSettings("--cache-flush-delay")
	runs := envInt(b.t, "BENCH_FLEET_RUNS", 4)
	slowest := map[string][]float64{}
	fmt.Printf("\nexperiment: cold Deployments of 1 and 4 replicas, the background flush as deployed and after 10 s, %d of each per setting\n", runs)
	inBlocks(settings, runs, func(s driverSetting, pass, rounds int) {
		set(s)
		for k := range rounds {
			for _, n := range stats.Rotated([]int{1, 4}, k+pass) {
				r := b.deployment(n, true)
				key := fmt.Sprintf("%s, %d", s.label, n)
				slowest[key] = append(slowest[key], r.slowest())
				fmt.Printf("  %-20s %d replica(s): slowest last byte %5.2f s, mounted %5.2f s, flush %5.2f → %5.2f s\n",
					s.label, n, r.slowest(), stats.Max(r.published), r.flush[0], r.flush[1])
			}
		}
	})
	fmt.Printf("  medians:")
	for _, s := range settings {
		one, four := stats.Median(slowest[s.label+", 1"]), stats.Median(slowest[s.label+", 4"])
		fmt.Printf("  %s: 1 replica %.2f s, 4 replicas %.2f s = %.2fx;", s.label, one, four, four/one)
	}
	fmt.Println()
}

// readaheadExperiment (BENCH_EXPERIMENT=readahead) starts warm pods (the node has the model, page cache dropped)
// in one cluster: for each setting of the node plugin's readahead a block of CSI pods, each beside a native image
// volume pod as the yardstick (alternately first), the blocks in one order and then in the reverse. What the
// readahead does to a warm start, without the noise of comparing runs. A block starts with a CSI pod that is not
// counted: the first pod after the plugin's restart measured slower reads whatever the setting. The cache
// survives the restarts (a host path), so every CSI pod is warm.
func (b *bench) readaheadExperiment() {
	t := b.t
	settings := []driverSetting{
		{"readahead as deployed", nil},
		{"readahead at mount", []string{"--readahead-wait=0"}},
		{"readahead off", []string{"--readahead=off"}},
	}
	set := b.driverSettings("--readahead")
	runs := envInt(t, "BENCH_WARM_RUNS", 6)
	b.measure("csi") // the model onto the node
	b.measure("image")
	const native = "native image volume"
	res := map[string][]float64{}
	fmt.Printf("\nexperiment: warm pods, the node plugin's readahead settings against the native image volume, %d pairs per setting\n", runs)
	line := func(label string, r result) {
		at := map[string]float64{}
		for _, p := range r.phases.phases {
			at[p.label] = p.at
		}
		fmt.Printf("  %-20s pod %5.2f s  mounted %5.2f  sandbox asked %5.2f  running %5.2f  container started %5.2f\n", label, r.last,
			at["driver: NodePublish answered OK (mounted)"], at["containerd: sandbox asked for"], at["containerd: sandbox running"], at["container started"])
	}
	inBlocks(settings, runs, func(s driverSetting, _, rounds int) {
		set(s)
		b.measure("csi") // not counted
		for k := range rounds {
			for _, v := range stats.Rotated([]string{"image", "csi"}, k) {
				label := map[string]string{"image": native, "csi": s.label}[v]
				r := b.measure(v)
				line(label, r)
				res[label] = append(res[label], r.last)
			}
		}
	})
	summary := func(settings []driverSetting) {
		yard := stats.Median(res[native])
		fmt.Printf("  medians (against the native image volume, %.2f s over %d pods):", yard, len(res[native]))
		for _, s := range settings {
			fmt.Printf("  %s %.2f s = %.2fx;", s.label, stats.Median(res[s.label]), stats.Median(res[s.label])/yard)
		}
		fmt.Println()
	}
	summary(settings)

	// A pod that reads its model seconds after it starts, as an inference server does after its imports.
	const after = "5"
	b.readAfter = after
	defer func() { b.readAfter = "" }()
	clear(res)
	fmt.Printf("\nthe same with pods that sleep %s s before they read (an inference server's imports), %d pairs per setting\n", after, runs/2)
	late := []driverSetting{settings[0], settings[2]}
	for i, s := range late {
		set(s)
		b.measure("csi") // not counted
		for k := range runs / 2 {
			for _, v := range stats.Rotated([]string{"image", "csi"}, k+i) {
				label := map[string]string{"image": native, "csi": s.label}[v]
				r := b.measure(v)
				line(label, r)
				res[label] = append(res[label], r.last)
			}
		}
	}
	summary(late)
}
