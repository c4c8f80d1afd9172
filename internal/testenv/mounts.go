package testenv

import (
	"os"
	"strings"
	"syscall"
	"testing"
)

// NoMountsLeftUnder fails the test if, when it ends, anything is still mounted below dir — a volume the code under
// test forgot to unmount — and detaches those mounts so one failure does not poison the machine.
func NoMountsLeftUnder(t testing.TB, dir string) {
	t.Helper()
	t.Cleanup(func() {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			return
		}
		var leaked []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && strings.HasPrefix(f[4], dir) {
				leaked = append(leaked, f[4])
			}
		}
		for i := len(leaked) - 1; i >= 0; i-- {
			syscall.Unmount(leaked[i], syscall.MNT_DETACH)
		}
		if len(leaked) > 0 {
			t.Errorf("mounts left behind: %v", leaked)
		}
	})
}
