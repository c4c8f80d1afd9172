package diskio

import (
	"os"

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
