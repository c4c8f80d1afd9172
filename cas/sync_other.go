//go:build !linux

package cas

import "os"

func fdatasync(f *os.File) error { return f.Sync() }
