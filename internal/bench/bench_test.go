package bench

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	in := []float64{3, 1, 2}
	Median(in)
	if !slices.Equal(in, []float64{3, 1, 2}) {
		t.Errorf("Median sorted its argument: %v", in)
	}
}

// Round r starts with the tool at r modulo their count, so no tool always runs first (or right after another's
// deletion); an error stops the round.
func TestRotate(t *testing.T) {
	var order []string
	tool := func(name string) func() error { return func() error { order = append(order, name); return nil } }
	for round := 1; round <= 3; round++ {
		if err := Rotate(round, tool("a"), tool("b"), tool("c")); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(order, ""); got != "bcacababc" {
		t.Errorf("order %q, want bca cab abc", got)
	}
	boom := errors.New("boom")
	order = nil
	if err := Rotate(0, tool("a"), func() error { return boom }, tool("c")); !errors.Is(err, boom) || strings.Join(order, "") != "a" {
		t.Errorf("Rotate after an error: %v, ran %v", err, order)
	}
}

// The verdict is the figure's as printed: 1.195 prints 1.20, which meets ">= 1.2".
func TestLineVerdictOfThePrintedFigure(t *testing.T) {
	if l := Line("push vs oras push", "", 1.1951, "%.2f", ">=", 1.2, "x"); !strings.Contains(l, "1.20x") || !strings.HasSuffix(l, "PASS") {
		t.Errorf("line %q", l)
	}
	if l := Line("peak RSS", "", 65, "%.0f", "<=", 64, " MiB"); !strings.HasSuffix(l, "MISS") {
		t.Errorf("line %q", l)
	}
	if got := Ratio(3, 2); got != "1.50" {
		t.Errorf("Ratio(3, 2) = %q", got)
	}
}
