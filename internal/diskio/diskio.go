// Package diskio holds the few file-system calls the stores need beyond package os: preallocation, the flushes
// of the durability protocol, and the readahead hint. Each has a portable fallback, so the stores build everywhere.
package diskio

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
)

// Preallocate reserves the blocks of the first size bytes of f without changing its size, so that a download
// learns at once that the disk cannot hold it, and its writes skip ext4's per-page delayed-allocation work
// (measured: README, Performance).
// Only a full disk or quota is an error: a file system that cannot preallocate is written as before.
func Preallocate(f *os.File, size int64) error {
	if size <= 0 {
		return nil
	}
	err := preallocate(f, size)
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return &os.PathError{Op: "preallocate", Path: f.Name(), Err: err}
	}
	return nil
}

// SyncDir flushes a directory, making the names created, renamed or removed in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// WriteFileAtomic replaces path with b through a temporary file in its directory, fsynced and renamed into place,
// then fsyncs the directory: a reader, after any crash, sees the old content or the new, never a torn mix.
func WriteFileAtomic(path string, b []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// ErrNotOurs: a private file (ReadPrivate) that is not a regular file this user wrote.
var ErrNotOurs = errors.New("not a regular file of ours")

// ReadPrivate reads a file only this process's user writes (a state file), without following a symbolic link: a
// link (to a forged file elsewhere), a FIFO or device, a file of another owner or one group or others may write is
// ErrNotOurs, for the caller to set aside rather than believe. A missing file is fs.ErrNotExist as for os.ReadFile.
func ReadPrivate(path string) ([]byte, error) { return readPrivate(path, 0o022) }

// ReadSecret is ReadPrivate for a secret (a key): a file group or others may read is ErrNotOurs too.
func ReadSecret(path string) ([]byte, error) { return readPrivate(path, 0o077) }
