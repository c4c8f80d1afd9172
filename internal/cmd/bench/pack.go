package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/modelpack/modelpack/internal/bench"
)

// benchPack: `modelpack pack` against `oras push --oci-layout` of the same model directory, side by side in one
// run, medians of RUNS (3), the tools alternating which goes first so neither always gets the warmer page cache.
// Each run writes into a fresh store.
//
// modelpack fsyncs every blob before it writes the tag (an interrupted pack never leaves a tag to missing data);
// oras leaves its blobs in the page cache. A second line therefore also times oras followed by an fsync of the
// blobs it wrote (coreutils `sync FILE...`), the same durability, so the cost of the guarantee is visible, and a
// third compares CPU time (user+sys), which a busy shared machine disturbs far less than wall time.
func benchPack(e *env) error {
	runs := envInt("RUNS", 3)
	mpBin, orasBin := envOr("MODELPACK", "modelpack"), envOr("ORAS", "oras")
	scratch, _, err := e.scratch("bench-pack")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)

	// oras is given the same top-level entries modelpack packs (hidden ones are skipped by both).
	des, err := os.ReadDir(e.modelDir)
	if err != nil {
		return err
	}
	var entries []string
	for _, d := range des {
		if !strings.HasPrefix(d.Name(), ".") {
			entries = append(entries, d.Name())
		}
	}
	slices.Sort(entries)

	var mpTimes, mpCPU, mpRSS, orasTimes, orasDurable, orasCPU []float64
	runModelpack := func() error {
		home := filepath.Join(scratch, "home")
		os.RemoveAll(home)
		defer os.RemoveAll(home)
		cmd := exec.Command(mpBin, "pack", e.modelDir, "-t", "bench/model:v1", "-q")
		t, err := timed(cmd, "MODELPACK_HOME="+home)
		if err != nil {
			return err
		}
		cpu, rss := usage(cmd)
		mpTimes, mpCPU, mpRSS = append(mpTimes, t), append(mpCPU, cpu), append(mpRSS, float64(rss))
		return nil
	}
	runOras := func() error {
		layout := filepath.Join(scratch, "oras-layout")
		os.RemoveAll(layout)
		defer os.RemoveAll(layout)
		cmd := exec.Command(orasBin, append([]string{"push", "--oci-layout", layout + ":v1"}, entries...)...)
		cmd.Dir, cmd.Stdout = e.modelDir, io.Discard
		push, err := timed(cmd)
		if err != nil {
			return err
		}
		cpu, _ := usage(cmd)
		blobs, _ := filepath.Glob(filepath.Join(layout, "blobs", "sha256", "*"))
		flush, err := timed(exec.Command("sync", append(blobs, filepath.Join(layout, "index.json"))...))
		if err != nil {
			return err
		}
		orasTimes, orasDurable, orasCPU = append(orasTimes, push), append(orasDurable, push+flush), append(orasCPU, cpu)
		return nil
	}
	for i := 1; i <= runs; i++ {
		if err := bench.Rotate(i-1, runModelpack, runOras); err != nil { // odd rounds: modelpack first
			return err
		}
	}

	mp, or, ord := bench.Median(mpTimes), bench.Median(orasTimes), bench.Median(orasDurable)
	fmt.Printf("pack: modelpack %ss oras %ss ratio %sx (target >=1.5x) rss %.0fMiB (target <100MiB)\n",
		bench.Secs(mp), bench.Secs(or), bench.Ratio(or, mp), bench.Max(mpRSS))
	fmt.Printf("pack durable: modelpack %ss oras+fsync %ss ratio %sx\n", bench.Secs(mp), bench.Secs(ord), bench.Ratio(ord, mp))
	mpc, orc := bench.Median(mpCPU), bench.Median(orasCPU)
	fmt.Printf("pack cpu: modelpack %.2fs oras %.2fs ratio %sx (user+sys: the work each does, whatever else the machine runs)\n",
		mpc, orc, bench.Ratio(orc, mpc))
	fmt.Printf("pack runs: modelpack %s s; oras %s s; oras+fsync %s s; modelpack peak RSS %s MiB\n",
		bench.Runs(mpTimes), bench.Runs(orasTimes), bench.Runs(orasDurable), whole(mpRSS))
	return nil
}
