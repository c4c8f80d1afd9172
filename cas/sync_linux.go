package cas

import (
	"os"

	"golang.org/x/sys/unix"
)

// fdatasync flushes a file's bytes and the metadata needed to read them, not its timestamps.
func fdatasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
