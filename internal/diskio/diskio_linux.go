package diskio

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

func preallocate(f *os.File, size int64) error {
	return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, size)
}

// Fdatasync flushes a file's bytes and the metadata needed to read them, not its timestamps.
func Fdatasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }

// WriteBack writes the dirty pages of f's bytes [off, off+n) to the disk and waits for them, without the metadata
// an fdatasync also flushes: a long flush done as a series of these keeps at most n bytes of it ahead of anyone
// else's writes in the disk's queue.
func WriteBack(f *os.File, off, n int64) error {
	return unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
}

// SyncFS flushes the file system holding dir: one call instead of an fsync per file written there.
func SyncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// ioprio_set(2)'s constants, which golang.org/x/sys/unix does not name.
const (
	ioprioWhoProcess = 1 // with who 0: the calling thread
	ioprioClassIdle  = 3
	ioprioClassShift = 13
)

// Background lowers the calling OS thread to the idle I/O class (its reads wait for every other reader of the
// disk, with the schedulers that honour classes: BFQ, mq-deadline) and to nice 19. Both are per thread on Linux:
// the caller locks its goroutine to the thread (runtime.LockOSThread) and returns without unlocking it, so the
// thread is dropped with the goroutine rather than handed to other goroutines.
func Background() error {
	if _, _, errno := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, 0, ioprioClassIdle<<ioprioClassShift); errno != 0 {
		return errno
	}
	return unix.Setpriority(unix.PRIO_PROCESS, 0, 19)
}

// ReadIntoCache brings f's bytes [off, off+n) into the page cache by reading them, a readahead window at a time
// (the larger of the device's read_ahead_kb and max_sectors_kb), into a buffer it then drops. A window already in
// the page cache (the kernel's own readahead of the last one, often) is skipped after a cachestat(2), which costs
// about 0.3 ms per GiB. It reads rather than advises (fadvise WILLNEED) on purpose: an advice is queued at once,
// window after window, and the disk then holds gigabytes of it ahead of anyone else's reads — in the cluster bench
// the kubelet's and the runtime's reads while starting the pod waited 0.5–1 s behind it, at the idle I/O class too,
// since a request the disk already has is not reordered. A read waits for its window, so one reader keeps about a
// window or two in flight (its own and the kernel's readahead of the next), as the pod's own reader would.
func ReadIntoCache(f *os.File, off, n int64) error {
	step := readaheadWindow(f)
	bufp := buffers.Get().(*[]byte)
	defer buffers.Put(bufp)
	if int64(len(*bufp)) < step {
		*bufp = make([]byte, step)
	}
	for end := off + n; off < end; off += step {
		w := min(step, end-off)
		if CachedBytes(f, off, w) == w {
			continue
		}
		if _, err := f.ReadAt((*bufp)[:w], off); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
	}
	return nil
}

// buffers are ReadIntoCache's, a window each.
var buffers = sync.Pool{New: func() any { return new([]byte) }}

// noCachestat is set once cachestat(2) proved missing (before Linux 6.5): every window is then read.
var noCachestat atomic.Bool

// CachedBytes is how many of f's bytes [off, off+n) are in the page cache (or being read into it), by whole pages;
// 0 where cachestat(2) is missing.
func CachedBytes(f *os.File, off, n int64) int64 {
	if noCachestat.Load() {
		return 0
	}
	var st unix.Cachestat_t
	err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{Off: uint64(off), Len: uint64(n)}, &st, 0)
	if errors.Is(err, unix.ENOSYS) {
		noCachestat.Store(true)
	}
	if err != nil {
		return 0
	}
	page := int64(os.Getpagesize())
	if pages := (off+n+page-1)/page - off/page; int64(st.Cache) >= pages {
		return n
	}
	return min(n, int64(st.Cache)*page)
}

// minWindow is the kernel's default readahead (VM_READAHEAD_PAGES), the step where the device cannot be read.
const minWindow = 128 << 10

// windows caches readaheadWindow by device: reading sysfs for every call cost more than the calls themselves. A
// window changed later (read_ahead_kb written) is not seen; a smaller one leaves gaps the reader fills itself.
var windows sync.Map // st_dev → int64

// readaheadWindow is the readahead window of f's device, from sysfs: the disk's queue (the parent's for a
// partition), else its backing device's (device-mapper, network and virtual file systems).
func readaheadWindow(f *os.File) int64 {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return minWindow
	}
	if w, ok := windows.Load(st.Dev); ok {
		return w.(int64)
	}
	w := deviceWindow(fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
	windows.Store(st.Dev, w)
	return w
}

func deviceWindow(dev string) int64 {
	var kib int64
	for _, p := range []string{
		"/sys/dev/block/" + dev + "/queue/read_ahead_kb", "/sys/dev/block/" + dev + "/queue/max_sectors_kb",
		"/sys/dev/block/" + dev + "/../queue/read_ahead_kb", "/sys/dev/block/" + dev + "/../queue/max_sectors_kb",
		"/sys/class/bdi/" + dev + "/read_ahead_kb",
	} {
		if b, err := os.ReadFile(p); err == nil {
			if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
				kib = max(kib, v)
			}
		}
	}
	if kib <= 0 {
		return minWindow
	}
	return kib << 10
}
