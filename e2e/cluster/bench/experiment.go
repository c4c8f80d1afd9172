//go:build cluster

package main

import (
	"fmt"
	"os"
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
