package cas

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// writeBehindChunk is how much a blob write dirties before its writeback is started.
const writeBehindChunk = 8 << 20

// writeBehind returns a writer to f (positioned at off) that starts writeback of every chunk it writes as soon as
// the chunk is complete. The fsync before commit then waits only for the tail, so a large download and its trip
// to disk overlap instead of running one after the other (with lots of RAM the kernel would otherwise hold the
// whole blob dirty until the fsync).
func writeBehind(f *os.File, off int64) io.Writer {
	return &behindWriter{f: f, start: off, off: off}
}

type behindWriter struct {
	f          *os.File
	start, off int64
}

func (w *behindWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.off += int64(n)
	if w.off-w.start >= writeBehindChunk {
		// Advisory: an error only means the final fsync does all the work.
		_ = unix.SyncFileRange(int(w.f.Fd()), w.start, w.off-w.start, unix.SYNC_FILE_RANGE_WRITE)
		w.start = w.off
	}
	return n, err
}

// fdatasync flushes a file's bytes and the metadata needed to read them, not its timestamps.
func fdatasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
