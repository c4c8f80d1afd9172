package cli

import (
	"strings"
	"testing"
)

// The driver's hardening settings are flags documented in its help, and bad values are refused before anything
// starts.
func TestCSIDriverHardeningFlags(t *testing.T) {
	out, err := runCLI(t, "csi-driver", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--max-extract-bytes", "--max-extract-ratio", "--registry-idle-timeout", "never https→http",
		"--registry-response-timeout", "--registry-attempts", "--readahead", "FAILED_PRECONDITION", "UNAVAILABLE"} {
		if !strings.Contains(out, want) {
			t.Errorf("csi-driver --help does not mention %s", want)
		}
	}
	for _, args := range [][]string{
		{"--max-extract-bytes", "lots"},
		{"--max-extract-bytes", "0"},
		{"--max-extract-ratio", "0.5"},
		{"--readahead", "lots"},
		{"--cache-flush-delay", "0s"},
		{"--cache-flush-delay", "-1s"},
	} {
		_, err := runCLI(t, append([]string{"csi-driver", "--root", t.TempDir(), "--endpoint", "unix://" + t.TempDir() + "/csi.sock", "--metrics-addr", ""}, args...)...)
		if err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%v: %v, want an error naming %s", args, err, args[0])
		}
	}
}

func TestParseReadahead(t *testing.T) {
	for _, tc := range []struct {
		in   string
		off  bool
		want int64 // the budget, when neither off nor auto
	}{
		{in: "off", off: true},
		{in: "0", off: true},
		{in: "0B", off: true},
		{in: "8GiB", want: 8 << 30},
		{in: "8Gi", want: 8 << 30},
		{in: "512MiB", want: 512 << 20},
		{in: "1G", want: 1e9},
		{in: " 4096 ", want: 4096},
	} {
		b, err := parseReadahead(tc.in)
		switch {
		case err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case tc.off != (b == nil):
			t.Errorf("%q: off is %v, want %v", tc.in, b == nil, tc.off)
		case b != nil && b() != tc.want:
			t.Errorf("%q: budget %d, want %d", tc.in, b(), tc.want)
		}
	}
	if b, err := parseReadahead("auto"); err != nil || b == nil || b() <= 0 {
		t.Errorf("auto: %v, want a budget above 0 on this machine", err)
	}
	for _, bad := range []string{"", "lots", "-1", "-1GiB", "Auto", "on", "8 parsecs", "1e400", "99999999999EiB"} {
		_, err := parseReadahead(bad)
		if err == nil || !strings.Contains(err.Error(), "--readahead") || !strings.Contains(err.Error(), "auto, off or a size") {
			t.Errorf("%q: %v, want an error naming --readahead and its valid forms", bad, err)
		}
	}
}
