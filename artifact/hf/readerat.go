package hf

import (
	"context"
	"fmt"
	"io"
	"sync"
)

// FileReaderAt reads one file of repo at commit at any offset, with HTTP Range requests: a reader that needs a
// file's header and not its body (a scanner of safetensors) costs a request, not a download. Sequential reads
// share one response; a read elsewhere starts another. Close releases the open response.
type FileReaderAt struct {
	c            *Client
	ctx          context.Context
	repo, commit string
	path         string
	size         int64

	mu     sync.Mutex
	cur    io.ReadCloser
	at     int64  // the offset cur's next byte is at
	win    []byte // the bytes a response began with, at winOff
	winOff int64
}

// ReaderAt returns a FileReaderAt of path (size bytes, as the tree lists it).
func (c *Client) ReaderAt(ctx context.Context, repo, commit, path string, size int64) *FileReaderAt {
	return &FileReaderAt{c: c, ctx: ctx, repo: repo, commit: commit, path: path, size: size}
}

// window is how much a new response reads at once: the small reads around a header (magic, length, JSON) are
// served from it without another request.
const window = 64 << 10

func (f *FileReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off >= f.size {
		return 0, io.EOF
	}
	want := p
	if rest := f.size - off; int64(len(want)) > rest {
		want = want[:rest]
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if off >= f.winOff && off+int64(len(want)) <= f.winOff+int64(len(f.win)) {
		n := copy(want, f.win[off-f.winOff:])
		return f.done(n, len(p))
	}
	if f.cur == nil || f.at != off {
		f.closeLocked()
		body, start, err := f.c.OpenFile(f.ctx, f.repo, f.commit, f.path, off)
		if err != nil {
			return 0, err
		}
		if start != off { // the server ignored the range: skip to off
			if _, err := io.CopyN(io.Discard, body, off-start); err != nil {
				body.Close()
				return 0, f.wrap(err)
			}
		}
		f.cur, f.at = body, off
		if len(want) < window {
			if w := int(min(int64(window), f.size-off)); cap(f.win) >= w {
				f.win = f.win[:w]
			} else {
				f.win = make([]byte, w)
			}
			n, err := io.ReadFull(f.cur, f.win)
			f.win, f.winOff, f.at = f.win[:n], off, off+int64(n)
			if err != nil {
				f.closeLocked()
				if n < len(want) {
					return copy(want, f.win), f.wrap(err)
				}
			}
			return f.done(copy(want, f.win), len(p))
		}
	}
	n, err := io.ReadFull(f.cur, want)
	f.at += int64(n)
	if err != nil {
		f.closeLocked()
		return n, f.wrap(err)
	}
	return f.done(n, len(p))
}

func (f *FileReaderAt) done(n, asked int) (int, error) {
	if n < asked {
		return n, io.EOF
	}
	return n, nil
}

func (f *FileReaderAt) wrap(err error) error {
	return fmt.Errorf("%s%s@%s/%s: %w", Scheme, f.repo, f.commit, f.path, err)
}

func (f *FileReaderAt) closeLocked() {
	if f.cur != nil {
		f.cur.Close()
		f.cur = nil
	}
}

// Close releases the response a read left open.
func (f *FileReaderAt) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closeLocked()
	return nil
}
