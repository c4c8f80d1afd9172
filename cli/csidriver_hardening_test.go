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
		"--registry-response-timeout", "--registry-attempts", "FAILED_PRECONDITION", "UNAVAILABLE"} {
		if !strings.Contains(out, want) {
			t.Errorf("csi-driver --help does not mention %s", want)
		}
	}
	for _, args := range [][]string{
		{"--max-extract-bytes", "lots"},
		{"--max-extract-bytes", "0"},
		{"--max-extract-ratio", "0.5"},
	} {
		_, err := runCLI(t, append([]string{"csi-driver", "--root", t.TempDir(), "--endpoint", "unix://" + t.TempDir() + "/csi.sock", "--metrics-addr", ""}, args...)...)
		if err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%v: %v, want an error naming %s", args, err, args[0])
		}
	}
}
