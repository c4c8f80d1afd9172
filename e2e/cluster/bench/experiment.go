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

// readaheadExperiment (BENCH_EXPERIMENT=readahead) starts warm pods (the node has the model, page cache dropped)
// in one cluster: for each setting of the node plugin's readahead a block of CSI pods, each beside a native image
// volume pod as the yardstick (alternately first), the blocks in one order and then in the reverse. What the
// readahead does to a warm start, without the noise of comparing runs. A block starts with a CSI pod that is not
// counted: the first pod after the plugin's restart measured slower reads whatever the setting. The cache
// survives the restarts (a host path), so every CSI pod is warm.
func (b *bench) readaheadExperiment() {
	t, c := b.t, b.c
	type setting struct {
		label string
		args  []string
	}
	settings := []setting{
		{"readahead as deployed", nil},
		{"readahead at mount", []string{"--readahead-wait=0"}},
		{"readahead off", []string{"--readahead=off"}},
	}
	var deployed []string
	if err := json.Unmarshal([]byte(c.Kubectl(t, "-n", harness.Namespace, "get", "daemonset", "modelpack-node", "-o",
		"jsonpath={.spec.template.spec.containers[0].args}")), &deployed); err != nil {
		t.Fatal(err)
	}
	// A run stopped half way may have left a setting behind.
	deployed = slices.DeleteFunc(deployed, func(a string) bool { return strings.HasPrefix(a, "--readahead") })
	current := ""
	set := func(s setting) {
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
	t.Cleanup(func() { set(settings[0]) })
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
	for pass := range 2 {
		order := slices.Clone(settings)
		if pass == 1 {
			slices.Reverse(order)
		}
		for _, s := range order {
			set(s)
			b.measure("csi") // not counted
			for k := range (runs + 1 - pass) / 2 {
				for _, v := range stats.Rotated([]string{"image", "csi"}, k) {
					label := map[string]string{"image": native, "csi": s.label}[v]
					r := b.measure(v)
					line(label, r)
					res[label] = append(res[label], r.last)
				}
			}
		}
	}
	summary := func(settings []setting) {
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
	late := []setting{settings[0], settings[2]}
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
