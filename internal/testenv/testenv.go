// Package testenv gives tests the real parts they run against: the pinned tools on PATH, root, a real
// distribution registry per test (LaunchRegistry starts the same one for the benchmarks), a reverse proxy in front
// of it (StartProxy) for tests that count, pace or break what crosses the wire, kubelet's publish request, docker
// configs, and one listing of a directory tree to compare trees by. Under CI=true a missing tool or privilege
// fails the test instead of skipping it.
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
)

// InCI reports whether the suite runs in CI, where skips are failures.
func InCI() bool { return os.Getenv("CI") == "true" }

// Unavailable skips the test locally and fails it in CI.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("required in CI: "+format, args...)
	}
	t.Skipf(format, args...)
}

// Tool returns the path of a pinned tool (from ./bin/tools or PATH), or stops the test.
func Tool(t testing.TB, name string) string {
	t.Helper()
	if p := filepath.Join(RepoRoot(), "bin", "tools", name); isExec(p) {
		return p
	}
	p, err := exec.LookPath(name)
	if err != nil {
		Unavailable(t, "%s not installed: run `make tools`", name)
	}
	return p
}

// Modelpack returns the path of the built modelpack binary, or stops the test.
func Modelpack(t testing.TB) string {
	t.Helper()
	p := filepath.Join(RepoRoot(), "bin", "modelpack")
	if !isExec(p) {
		Unavailable(t, "bin/modelpack not built: run `make build`")
	}
	return p
}

// RequireRoot stops the test unless it runs as root (mounts need it).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root for mounts")
	}
}

// SmallDisk mounts a tmpfs of size ("4m", "256k") at a fresh directory, unmounted by that path at cleanup, also
// when the test fails: a file system small enough to fill.
func SmallDisk(t testing.TB, size string) string {
	t.Helper()
	RequireRoot(t)
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		Unavailable(t, "mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// RepoRoot is the module root, found from this file's location.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}
