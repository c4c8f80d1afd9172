package remote

import (
	"fmt"
	"testing"
)

// Content-Range comes from the registry: any value parses without panicking, and what parses round-trips.
func FuzzParseContentRange(f *testing.F) {
	for _, s := range []string{"bytes 0-99/100", "bytes 5-9/*", "bytes */100", "bytes 1-", "", "bytes -1-2/3", "items 0-1/2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		first, total, ok := ParseContentRange(h)
		if !ok {
			return
		}
		if first < 0 || total < -1 {
			t.Fatalf("%q: first %d, total %d", h, first, total)
		}
		size := "*"
		if total >= 0 {
			size = fmt.Sprint(total)
		}
		again, total2, ok2 := ParseContentRange(fmt.Sprintf("bytes %d-x/%s", first, size))
		if !ok2 || again != first || (total >= 0 && total2 != total) {
			t.Fatalf("%q: %d/%d does not round-trip: %d/%d %v", h, first, total, again, total2, ok2)
		}
	})
}
