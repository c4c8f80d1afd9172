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

// SyncFS flushes the file system holding dir: one call instead of an fsync per file written there.
func SyncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
