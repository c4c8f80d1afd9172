// Package bench holds the arithmetic every benchmark program of this repository shares, so that their figures are
// computed one way: the median of a figure's rounds, the rotation of the tools measured in a round, ratios against
// a peer and the PASS/MISS verdict against a target.
//
// Benchmarks here measure a tool side by side with its peer (oras, crane, curl, …) in one run and report ratios:
// absolute times drift on shared machines, ratios much less. Rounds interleave the tools and rotate their order
// (see Rotate), and a figure is the median of its rounds.
package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	humanize "github.com/dustin/go-humanize"

	"github.com/modelpack/modelpack/internal/testmodel"
)

// Median is the median of xs (the mean of the middle two for an even count); 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Max is the largest of xs; 0 for none.
func Max(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return slices.Max(xs)
}

// Rotate runs fns in turn, starting with the one at round modulo their count. Benchmarks rotate their tools round
// by round: on this kind of virtual machine what runs right after gigabytes were deleted can be much slower (the
// freed memory goes back to the host and is faulted in again), and a fixed order would always hand that to the
// same tool. It stops at the first error.
func Rotate(round int, fns ...func() error) error {
	for _, fn := range Rotated(fns, round) {
		if err := fn(); err != nil {
			return err
		}
	}
	return nil
}

// Rotated is s starting at its element round modulo its length, for benchmarks that rotate values, not calls.
func Rotated[T any](s []T, round int) []T {
	i := round % len(s)
	return append(slices.Clone(s[i:]), s[:i]...)
}

// Model writes a generated model of spec into dir unless a complete one is there (marked by .complete, which
// modelpack skips as a hidden file): the benchmark model is generated once per machine.
func Model(dir string, spec testmodel.Spec) error {
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		return nil
	}
	os.RemoveAll(dir)
	fmt.Printf("generating the benchmark model (%d × %s) in %s\n", spec.Shards, humanize.IBytes(uint64(spec.ShardSize)), dir)
	if err := testmodel.Generate(dir, spec); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, ".complete"), nil, 0o644)
}

// Time runs fn and returns the seconds it took.
func Time(fn func() error) (float64, error) {
	start := time.Now()
	err := fn()
	return time.Since(start).Seconds(), err
}

// Ratio formats a/b to two decimals, as every benchmark prints its ratios.
func Ratio(a, b float64) string { return fmt.Sprintf("%.2f", a/b) }

// Secs formats seconds to three decimals.
func Secs(s float64) string { return fmt.Sprintf("%.3f", s) }

// Runs formats each round's seconds, space-separated, for the line that shows what a median came from.
func Runs(xs []float64) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = Secs(x)
	}
	return strings.Join(out, " ")
}

// Verdict is PASS when v meets the target (op ">=" or "<="), MISS otherwise.
func Verdict(v float64, op string, target float64) string {
	ok := v <= target
	if op == ">=" {
		ok = v >= target
	}
	if ok {
		return "PASS"
	}
	return "MISS"
}

// Line prints one figure with its target and verdict, in the column layout the benchmarks share:
// label, detail (the times the value came from), the value with its unit, the target and the verdict.
func Line(label, detail string, value float64, format, op string, target float64, unit string) string {
	v := fmt.Sprintf(format, value)
	shown, _ := strconv.ParseFloat(v, 64) // the verdict of the figure as printed
	return fmt.Sprintf("%-34s %-44s %8s  target %s %g%s  %s", label, detail, v+unit, op, target, unit, Verdict(shown, op, target))
}
