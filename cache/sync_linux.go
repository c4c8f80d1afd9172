package cache

import (
	"os"

	"golang.org/x/sys/unix"
)

// syncFS flushes the filesystem holding dir: one call instead of an fsync per extracted file.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
