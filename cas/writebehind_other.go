//go:build !linux

package cas

import (
	"io"
	"os"
)

func writeBehind(f *os.File, _ int64) io.Writer { return f }

func fdatasync(f *os.File) error { return f.Sync() }
