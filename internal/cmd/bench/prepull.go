package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/modelpack/modelpack/internal/bench"
)

// benchPrepull: prepull throughput of the benchmark model vs a cold publish of it, each on an empty node cache of a
// fresh driver (needs root: mounts). A prepull must move the model as fast as a pod's first mount does (target:
// within 10%). Rounds alternate which goes first so drift on a shared machine hits both alike; medians of
// PREPULL_N rounds (5).
func benchPrepull(e *env) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root for mounts")
	}
	n := envInt("PREPULL_N", 5)
	d, blobs, err := e.scratch("prepull")
	if err != nil {
		return err
	}
	defer os.RemoveAll(d)
	csi, err := buildCSIClient(d)
	if err != nil {
		return err
	}
	weights, err := firstWeights(e.modelDir)
	if err != nil {
		return err
	}
	// Each run starts its own driver on an empty cache, times fn, checks what it did with check, and stops the
	// driver whatever happened.
	withDriver := func(name string, into *[]float64, fn, check func(p *driverProc) error) func() error {
		return func() error {
			root := filepath.Join(d, name)
			p, err := startDriver("modelpack", root, e.registry.Host, filepath.Join(d, name+".log"), "warn", true)
			if err != nil {
				return err
			}
			defer func() { p.stop(root); os.RemoveAll(root) }()
			t, err := bench.Time(func() error { return fn(p) })
			if err != nil {
				return err
			}
			*into = append(*into, t)
			return check(p)
		}
	}
	var pub, pre []float64
	coldPublish := withDriver("publish", &pub, func(p *driverProc) error {
		return p.publish(csi, "vol-bench", filepath.Join(p.root, "pod", "mount"), e.ref)
	}, func(p *driverProc) error {
		if fi, err := os.Stat(filepath.Join(p.root, "pod", "mount", weights)); err != nil || fi.Size() == 0 {
			return fmt.Errorf("the publish mounted no weights (%s: %v)", weights, err)
		}
		return nil
	})
	prepull := withDriver("prepull", &pre, func(p *driverProc) error {
		return run1(exec.Command("modelpack", "prepull", "-q", "--socket", filepath.Join(p.root, "prepull.sock"), e.ref))
	}, func(p *driverProc) error {
		var out bytes.Buffer
		cmd := exec.Command("modelpack", "prepull", "status", "--socket", filepath.Join(p.root, "prepull.sock"))
		cmd.Stdout = &out
		if err := run1(cmd); err != nil {
			return err
		}
		if !strings.Contains(out.String(), "ready") {
			return fmt.Errorf("the prepull is not ready: %s", out.String())
		}
		return nil
	})
	warmRegistry := blobs.curlAll(filepath.Join(d, "warm"), false) // so the first measured run is not penalised
	os.RemoveAll(filepath.Join(d, "warm"))
	if warmRegistry != nil {
		return warmRegistry
	}
	for i := 1; i <= n; i++ {
		if err := bench.Rotate(i-1, coldPublish, prepull); err != nil { // odd rounds: the publish first
			return err
		}
	}
	tPub, tPre := bench.Median(pub), bench.Median(pre)
	mibs := func(t float64) string { return fmt.Sprintf("%.0f", float64(blobs.bytes())/t/(1<<20)) }
	r := tPub / tPre
	fmt.Printf("%-44s %8ss  %5s MiB/s   (runs: %s)\n", "cold publish ("+e.size+", empty cache)", bench.Secs(tPub), mibs(tPub), bench.Runs(pub))
	fmt.Printf("%-44s %8ss  %5s MiB/s   (runs: %s)\n", "prepull ("+e.size+", empty cache)", bench.Secs(tPre), mibs(tPre), bench.Runs(pre))
	fmt.Printf("%-44s %8s×  (target 0.90–1.10)\n", "prepull throughput / cold publish", bench.Ratio(tPub, tPre))
	switch {
	case r < 0.90:
		fmt.Printf("MISSED: prepull moves the model slower than a cold publish (%s×)\n", bench.Ratio(tPub, tPre))
	case r > 1.10:
		fmt.Printf("OUTSIDE 0.90–1.10 on the fast side: prepull is %s× as fast as a cold publish of the same bytes\n", bench.Ratio(tPub, tPre))
	}
	return nil
}
