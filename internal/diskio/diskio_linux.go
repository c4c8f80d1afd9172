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

// WillNeed asks the kernel to read f's bytes [off, off+n) into the page cache and returns without waiting for
// the reads, with the number of bytes it asked for. One fadvise(WILLNEED) reads at most the file's readahead
// window (the larger of the device's read_ahead_kb and max_sectors_kb: mm/readahead.c, force_page_cache_ra) and
// silently drops the rest, so the range is advised one window at a time. A window already in the page cache is
// skipped after a cachestat(2), which costs about 0.3 ms per GiB where fadvise's own skipping costs 10.
func WillNeed(f *os.File, off, n int64) (int64, error) {
	step := readaheadWindow(f)
	var asked int64
	for end := off + n; off < end; off += step {
		w := min(step, end-off)
		if cached(f, off, w) {
			continue
		}
		if err := unix.Fadvise(int(f.Fd()), off, w, unix.FADV_WILLNEED); err != nil {
			return asked, &os.PathError{Op: "fadvise", Path: f.Name(), Err: err}
		}
		asked += w
	}
	return asked, nil
}

// noCachestat is set once cachestat(2) proved missing (before Linux 6.5): every window is then advised.
var noCachestat atomic.Bool

// cached reports whether every page of f's bytes [off, off+n) is in the page cache (or being read into it).
func cached(f *os.File, off, n int64) bool {
	if noCachestat.Load() {
		return false
	}
	var st unix.Cachestat_t
	err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{Off: uint64(off), Len: uint64(n)}, &st, 0)
	if errors.Is(err, unix.ENOSYS) {
		noCachestat.Store(true)
	}
	page := int64(os.Getpagesize())
	return err == nil && int64(st.Cache) >= (off+n+page-1)/page-off/page
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

// FreeSpace is the bytes an unprivileged writer may still allocate on the file system holding path (statfs's
// f_bavail blocks).
func FreeSpace(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

func readPrivate(path string, deny uint32) ([]byte, error) {
	// O_NONBLOCK: opening a FIFO swapped in must not hang the driver's start.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s: %w: a symbolic link", path, ErrNotOurs)
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if err := ours(path, &st, deny); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}

func ours(path string, st *unix.Stat_t, deny uint32) error {
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return fmt.Errorf("%s: %w: a symbolic link", path, ErrNotOurs)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("%s: %w: type %#o", path, ErrNotOurs, st.Mode&unix.S_IFMT)
	case st.Uid != uint32(os.Geteuid()):
		return fmt.Errorf("%s: %w: owned by uid %d", path, ErrNotOurs, st.Uid)
	case st.Mode&deny != 0:
		return fmt.Errorf("%s: %w: mode %04o lets others at it", path, ErrNotOurs, st.Mode&0o7777)
	}
	return nil
}

// CheckPrivate is ReadPrivate's test for a file opened by another library (a bbolt database): nil for a regular
// file of ours nobody else may write, not followed if a link.
func CheckPrivate(path string) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	return ours(path, &st, 0o022)
}
