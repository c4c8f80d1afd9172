package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Under `set -e` a check written as `cmd && echo ok` passes when cmd fails (a failing && list does not stop the
// script), so the demo and the benchmarks must write checks as `cmd || fail …`.
func TestScriptChecksCanFail(t *testing.T) {
	scripts, err := filepath.Glob("*.sh")
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts found: %v", err)
	}
	reportsSuccess := regexp.MustCompile(`&&\s*(echo|printf)\b`)
	for _, s := range scripts {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			code := strings.TrimSpace(line)
			if strings.HasPrefix(code, "#") || strings.HasPrefix(code, "if ") || strings.HasPrefix(code, "while ") {
				continue
			}
			if reportsSuccess.MatchString(code) {
				t.Errorf("%s:%d: %q reports success with && under set -e; write `cmd || fail …` then the message", s, i+1, code)
			}
		}
	}
}
