//go:build linux

package testenv

import (
	"os"
	"strconv"
	"strings"
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

// PageCacheDrops counts the drops of the whole machine's page cache so far (writes to /proc/sys/vm/drop_caches,
// which benches on a shared machine make): pages read ahead and then gone are a failure only if none came between.
func PageCacheDrops(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/vmstat")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "drop_pagecache "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("/proc/vmstat: %q", line)
			}
			return n
		}
	}
	return 0
}

// WaitResident waits for reads handed to the kernel (a readahead) to bring path into the page cache, and fails
// the test if they never do. It asks for 95 % of the pages, not all: the kernel drops readahead quietly when it
// cannot get memory or a request at once, and on the test VMs a few pages of a file read ahead went missing
// without any reclaim counted (0.1–1.7 % of 256 MiB files), while a readahead that does not work leaves most of
// a file out. When the machine's page cache was dropped since drops (PageCacheDrops taken before the readahead),
// redo runs the readahead again and the wait starts over. The timeout only bounds a failure; nothing is measured.
func WaitResident(t testing.TB, path string, drops int64, redo func()) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		n, total := ResidentPages(t, path)
		if n >= total-total/20 {
			return
		}
		if now := PageCacheDrops(t); now != drops {
			t.Logf("the machine's page cache was dropped during the test: reading %s ahead again", path)
			drops = now
			redo()
			deadline = time.Now().Add(time.Minute)
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d pages resident a minute after the readahead, want 95 %%", path, n, total)
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
