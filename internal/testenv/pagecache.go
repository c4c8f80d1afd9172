//go:build linux

package testenv

import (
	"os"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// EvictPages flushes path and drops its pages from the page cache (this file only, not the machine's cache), and
// fails the test unless none is left resident.
func EvictPages(t testing.TB, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if n, total := ResidentPages(t, path); n != 0 {
		t.Fatalf("%s: %d of %d pages still resident after FADV_DONTNEED", path, n, total)
	}
}

// WaitResident waits for reads handed to the kernel (a readahead) to bring every page of path into the page
// cache, and fails the test if some never arrive. The timeout only bounds a failure; nothing is measured.
func WaitResident(t testing.TB, path string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		n, total := ResidentPages(t, path)
		if n == total {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d pages resident a minute after the readahead", path, n, total)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ResidentPages reports how many of path's pages are in the page cache (mincore(2) on a shared mapping, which
// itself reads nothing).
func ResidentPages(t testing.TB, path string) (resident, total int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() == 0 {
		return 0, 0
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	page := int64(os.Getpagesize())
	vec := make([]byte, (fi.Size()+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore %s: %v", path, errno)
	}
	for _, v := range vec {
		if v&1 != 0 {
			resident++
		}
	}
	return resident, len(vec)
}
