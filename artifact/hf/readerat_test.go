package hf

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv/hubserver"
)

// ReadAt at any offset returns the file's bytes there, through the LFS redirect, with one response for
// sequential reads and a new range for a jump; the end is io.EOF.
func TestFileReaderAt(t *testing.T) {
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>9)
	}
	s := hubserver.Start(t, hubserver.Repo{Name: "acme/tiny", Files: map[string][]byte{"w.bin": data}})
	c, err := NewClient(s.URL, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background(), Ref{Repo: "acme/tiny", Revision: "main"})
	if err != nil {
		t.Fatal(err)
	}
	ra := c.ReaderAt(context.Background(), "acme/tiny", info.SHA, "w.bin", int64(len(data)))
	defer ra.Close()
	before := len(s.Requests())
	for _, r := range []struct{ off, n int }{{0, 8}, {8, 100}, {100, 512}, {2 << 20, 1 << 20}, {3<<20 - 10, 10}, {1 << 20, 70000}, {1<<20 + 70000, 5}} {
		got := make([]byte, r.n)
		n, err := ra.ReadAt(got, int64(r.off))
		if err != nil || n != r.n || !bytes.Equal(got, data[r.off:r.off+r.n]) {
			t.Fatalf("ReadAt(%d, %d): %d, %v", r.n, r.off, n, err)
		}
	}
	buf := make([]byte, 20)
	if n, err := ra.ReadAt(buf, int64(len(data)-10)); n != 10 || err != io.EOF || !bytes.Equal(buf[:10], data[len(data)-10:]) {
		t.Fatalf("read across the end: %d, %v", n, err)
	}
	// 0..512 from the first response's window; 2 MiB, the tail, 1 MiB: new ranges; 1 MiB+70000 continues.
	if got := len(s.Requests()) - before; got > 10 {
		t.Errorf("%d requests for 8 reads", got)
	}
}
