//go:build !linux

package diskio

import (
	"errors"
	"os"
)

func preallocate(*os.File, int64) error { return errors.ErrUnsupported }

// Fdatasync flushes a file (with its metadata, where fdatasync(2) does not exist).
func Fdatasync(f *os.File) error { return f.Sync() }

// WriteBack does nothing where sync_file_range(2) does not exist: the Fdatasync that follows flushes it all.
func WriteBack(*os.File, int64, int64) error { return nil }

// SyncFS flushes dir itself where syncfs(2) does not exist.
func SyncFS(dir string) error { return SyncDir(dir) }

// Background does nothing where I/O classes are Linux's.
func Background() error { return nil }

// WillNeed does nothing where fadvise(2) does not exist: the reader faults the pages in itself.
func WillNeed(*os.File, int64, int64) (int64, error) { return 0, nil }

// FreeSpace is unknown here.
func FreeSpace(string) (int64, error) { return 0, errors.ErrUnsupported }

func readPrivate(path string, _ uint32) ([]byte, error) { return os.ReadFile(path) }

// CheckPrivate only checks that path exists here.
func CheckPrivate(path string) error {
	_, err := os.Lstat(path)
	return err
}
