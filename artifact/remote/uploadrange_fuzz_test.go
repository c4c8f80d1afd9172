package remote

import (
	"fmt"
	"testing"
)

// An upload session's Range header comes from the registry: any value parses without panicking, a held count is
// never negative, and what parses round-trips.
func FuzzParseUploadRange(f *testing.F) {
	for _, s := range []string{"0-0", "0-1048575", "bytes=0-99", "", "0--1", "1-5", "0-9223372036854775807", "0-x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		held, ok := parseUploadRange(h)
		if !ok {
			return
		}
		if held < 0 || held == 1 {
			t.Fatalf("%q: %d bytes held", h, held)
		}
		last := held - 1
		if held == 0 {
			last = 0
		}
		if again, ok := parseUploadRange(fmt.Sprintf("0-%d", last)); !ok || again != held {
			t.Fatalf("%q: %d does not round-trip: %d %v", h, held, again, ok)
		}
	})
}
