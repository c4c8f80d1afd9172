package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/modelpack/modelpack/internal/bench"
)

// benchTransport: modelpack pull/fetch/push against oras and a plain parallel curl download, side by side on one
// registry, medians of RUNS (5) rounds whose tool order rotates (see bench.Rotate). One line per figure with its
// ratio and target. BENCH_BASELINE_BIN: another modelpack binary whose pull and fetch are measured in the same
// rounds (before/after).
func benchTransport(e *env) error {
	runs := envInt("RUNS", 5)
	t, blobs, err := e.scratch("transport")
	if err != nil {
		return err
	}
	defer os.RemoveAll(t)
	baseline := os.Getenv("BENCH_BASELINE_BIN")
	home, fetchDir, orasDir, curlDir := filepath.Join(t, "home"), filepath.Join(t, "fetch"), filepath.Join(t, "oras"), filepath.Join(t, "curl")

	// Each measurement starts from empty destinations and a settled disk.
	measure := func(into *[]float64, fn func() error) func() error {
		return func() error {
			fresh(home, fetchDir, orasDir, curlDir)
			s, err := bench.Time(fn)
			*into = append(*into, s)
			return err
		}
	}
	mpPull := func(bin string) func() error {
		return func() error { return run1(exec.Command(bin, "--home", home, "pull", "--plain-http", "-q", e.ref)) }
	}
	mpFetch := func(bin string) func() error {
		return func() error { return run1(exec.Command(bin, "fetch", "--plain-http", "-q", e.ref, fetchDir)) }
	}
	orasPull := func() error {
		cmd := exec.Command("oras", "pull", "--plain-http", "-o", orasDir, e.ref)
		cmd.Stdout = io.Discard
		return run1(cmd)
	}
	var pullRuns, fetchRuns, orasRuns, curlRuns, curlsRuns, bpullRuns, bfetchRuns []float64
	tools := []func() error{
		measure(&pullRuns, mpPull("modelpack")),
		measure(&fetchRuns, mpFetch("modelpack")),
		measure(&orasRuns, orasPull),
		measure(&curlRuns, func() error { return blobs.curlAll(curlDir, false) }),
		// The same download made durable: what waiting for the disk costs (modelpack pull names verified blobs at
		// once and flushes them in the background, marking each durable when its flush completed).
		measure(&curlsRuns, func() error { return blobs.curlAll(curlDir, true) }),
	}
	if baseline != "" {
		tools = append(tools, measure(&bpullRuns, mpPull(baseline)), measure(&bfetchRuns, mpFetch(baseline)))
	}
	for i := 1; i <= runs; i++ {
		if err := bench.Rotate(i, tools...); err != nil {
			return err
		}
	}
	fresh(home, fetchDir, orasDir, curlDir)
	pull, fetch, oras, curl, curlSync := bench.Median(pullRuns), bench.Median(fetchRuns), bench.Median(orasRuns), bench.Median(curlRuns), bench.Median(curlsRuns)

	// Pushes: modelpack from its store (packed once, not timed) vs oras from the directory, each run to a new
	// repository so every blob is uploaded.
	store := "MODELPACK_HOME=" + filepath.Join(t, "store")
	if err := run1(exec.Command("modelpack", "pack", e.modelDir, "-t", "bench/push:v1", "-q"), store); err != nil {
		return err
	}
	files, err := orasFiles(e.modelDir)
	if err != nil {
		return err
	}
	reg := e.registry.Host
	var pushRuns, orasPushRuns []float64
	for i := 1; i <= runs; i++ {
		s, err := timed(exec.Command("modelpack", "push", "--plain-http", "-q", "--from", "bench/push:v1", fmt.Sprintf("%s/bench/mp-push-%d:v1", reg, i)), store)
		if err != nil {
			return err
		}
		pushRuns = append(pushRuns, s)
		cmd := exec.Command("oras", append([]string{"push", "--plain-http", "--artifact-type", "application/vnd.cncf.model.manifest.v1+json",
			fmt.Sprintf("%s/bench/oras-push-%d:v1", reg, i)}, files...)...)
		cmd.Dir, cmd.Stdout = e.modelDir, io.Discard
		if s, err = timed(cmd); err != nil {
			return err
		}
		orasPushRuns = append(orasPushRuns, s)
	}
	push, orasPush := bench.Median(pushRuns), bench.Median(orasPushRuns)

	// A repeated push sends no layer bytes.
	var out bytes.Buffer
	cmd := exec.Command("modelpack", "push", "--plain-http", "-q", "-o", "json", "--from", "bench/push:v1", reg+"/bench/mp-push-1:v1")
	cmd.Stdout = &out
	if err := run1(cmd, store); err != nil {
		return err
	}
	var pushed struct {
		TransferredBytes float64 `json:"transferredBytes"`
	}
	if err := json.Unmarshal(out.Bytes(), &pushed); err != nil {
		return fmt.Errorf("modelpack push -o json: %w", err)
	}

	// Peak RSS of a pull.
	fresh(home)
	cmd = exec.Command("modelpack", "--home", home, "pull", "--plain-http", "-q", e.ref)
	if err := run1(cmd); err != nil {
		return err
	}
	_, rss := usage(cmd)

	s := bench.Secs
	fmt.Printf("transport (%s model, medians of %d; ratios > 1 mean modelpack is faster unless noted)\n", e.size, runs)
	fmt.Println(bench.Line("pull vs oras pull", fmt.Sprintf("modelpack %ss, oras %ss", s(pull), s(oras)), oras/pull, "%.2f", ">=", 1.3, "x"))
	fmt.Println(bench.Line("fetch vs oras pull", fmt.Sprintf("modelpack %ss, oras %ss", s(fetch), s(oras)), oras/fetch, "%.2f", ">=", 1.3, "x"))
	fmt.Println(bench.Line("pull / parallel curl (lower is better)", fmt.Sprintf("modelpack %ss, curl %ss", s(pull), s(curl)), pull/curl, "%.2f", "<=", 1.2, "x"))
	fmt.Println(bench.Line("fetch / parallel curl (lower is better)", fmt.Sprintf("modelpack %ss, curl %ss", s(fetch), s(curl)), fetch/curl, "%.2f", "<=", 1.2, "x"))
	fmt.Println(bench.Line("pull / (parallel curl + fsync)", fmt.Sprintf("modelpack %ss, curl+fsync %ss", s(pull), s(curlSync)), pull/curlSync, "%.2f", "<=", 1.25, "x"))
	fmt.Println(bench.Line("push vs oras push", fmt.Sprintf("modelpack %ss, oras %ss", s(push), s(orasPush)), orasPush/push, "%.2f", ">=", 1.2, "x"))
	fmt.Println(bench.Line("peak RSS during pull", "modelpack pull", float64(rss), "%.0f", "<=", 64, " MiB"))
	if baseline != "" {
		bp, bf := bench.Median(bpullRuns), bench.Median(bfetchRuns)
		fmt.Printf("baseline %s: pull %ss (%s× curl; runs %s), fetch %ss (%s× curl)\n", baseline, s(bp), bench.Ratio(bp, curl), bench.Runs(bpullRuns), s(bf), bench.Ratio(bf, curl))
	}
	fmt.Printf("runs: pull %s | fetch %s | oras %s | curl %s\n", bench.Runs(pullRuns), bench.Runs(fetchRuns), bench.Runs(orasRuns), bench.Runs(curlRuns))
	fmt.Println(bench.Line("layer bytes resent by a repeated push", "modelpack push, same model twice", pushed.TransferredBytes, "%.0f", "<=", 0, " B"))
	return nil
}
