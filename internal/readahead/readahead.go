// Package readahead warms the page cache with the files of a volume the moment it is published. A pod starts
// reading its model a second or more after the mount (the sandbox, the container, an inference server's imports):
// reads the driver asks for at once, many files deep, find the disk idle and leave the files in memory by then,
// where a native image volume's reader starts from the disk. It only ever reads: files are opened read-only and
// never through a symbolic link, and the kernel is told which bytes will be needed (fadvise WILLNEED), so
// nothing is copied and no thread waits for the disk.
package readahead

import (
	"cmp"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/modelpack/modelpack/internal/diskio"
)

const (
	// chunk is how much of a file is advised between checks for cancellation.
	chunk = 32 << 20
	// workers read this many files at once, so the disk has a deep queue.
	workers = 4
)

// Budget returns the most bytes one readahead may bring into memory; it is asked when the readahead starts.
type Budget func() int64

// Fixed is a budget of n bytes.
func Fixed(n int64) Budget { return func() int64 { return n } }

// Result is what one readahead did.
type Result struct {
	// Dir is the directory read.
	Dir string
	// Files and Bytes were advised; Skipped and SkippedBytes were not, being over Budget.
	Files, Skipped      int
	Bytes, SkippedBytes int64
	Budget              int64
	// Duration is the time to hand every read to the kernel, which may still be completing some.
	Duration time.Duration
	// Err is the first failure (a file that vanished, a stop); the other files were still read.
	Err error
}

// Reader runs readaheads, one at a time per directory.
type Reader struct {
	ctx    context.Context
	budget Budget
	done   func(Result)

	mu      sync.Mutex
	running map[string]*run
	wg      sync.WaitGroup

	// gate, if set, is called by each readahead before it reads anything (tests hold runs with it).
	gate func(dir string)
}

type run struct{ cancel context.CancelFunc }

// New returns a Reader whose readaheads stop when ctx ends; done, if not nil, receives each one's Result.
func New(ctx context.Context, budget Budget, done func(Result)) *Reader {
	return &Reader{ctx: ctx, budget: budget, done: done, running: map[string]*run{}}
}

// Start reads the regular files under dir into the page cache in the background, smallest first, as far as the
// budget allows. It returns false, doing nothing, when a readahead of dir is already running: replicas that
// mount one view read it once.
func (r *Reader) Start(dir string) bool {
	dir = filepath.Clean(dir)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.running[dir]; ok || r.ctx.Err() != nil {
		return false
	}
	ctx, cancel := context.WithCancel(r.ctx)
	me := &run{cancel: cancel}
	r.running[dir] = me
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		res := r.read(ctx, dir)
		r.mu.Lock()
		if r.running[dir] == me {
			delete(r.running, dir)
		}
		r.mu.Unlock()
		cancel()
		if r.done != nil {
			r.done(res)
		}
	}()
	return true
}

// Stop cancels the readahead of dir, if one runs; it stops within a chunk per file being read.
func (r *Reader) Stop(dir string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if run, ok := r.running[filepath.Clean(dir)]; ok {
		run.cancel()
	}
}

// Wait blocks until every readahead started has ended.
func (r *Reader) Wait() { r.wg.Wait() }

type file struct {
	path string
	size int64
}

func (r *Reader) read(ctx context.Context, dir string) Result {
	start := time.Now()
	res := Result{Dir: dir, Budget: r.budget()}
	if r.gate != nil {
		r.gate(dir)
	}
	files, err := list(dir)
	res.Err = err
	var todo []file
	for i, f := range files {
		if res.Bytes+f.size > res.Budget {
			for _, s := range files[i:] {
				res.Skipped++
				res.SkippedBytes += s.size
			}
			break
		}
		todo = append(todo, f)
		res.Files++
		res.Bytes += f.size
	}

	queue := make(chan file)
	errs := make(chan error, len(todo))
	var wg sync.WaitGroup
	for range min(workers, len(todo)) {
		wg.Go(func() {
			for f := range queue {
				errs <- advise(ctx, f.path)
			}
		})
	}
feed:
	for _, f := range todo {
		select {
		case queue <- f:
		case <-ctx.Done():
			break feed
		}
	}
	close(queue)
	wg.Wait()
	close(errs)
	for err := range errs {
		res.Err = cmp.Or(res.Err, err)
	}
	if ctx.Err() != nil {
		res.Err = cmp.Or(res.Err, context.Cause(ctx))
	}
	res.Duration = time.Since(start)
	return res
}

// list returns the regular files under dir, smallest first (the config and tokenizer a server reads before its
// weights), then by path. Symbolic links are not followed, so nothing outside dir is read.
func list(dir string) ([]file, error) {
	var files []file
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		files = append(files, file{p, fi.Size()})
		return nil
	})
	slices.SortFunc(files, func(a, b file) int { return cmp.Or(cmp.Compare(a.size, b.size), cmp.Compare(a.path, b.path)) })
	return files, err
}

// advise hands the kernel the reads of one file, a chunk at a time so that a stop is heard between chunks.
func advise(ctx context.Context, path string) error {
	// O_NOFOLLOW: a file swapped for a link after the walk is refused, not followed.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	for off := int64(0); off < fi.Size(); off += chunk {
		if ctx.Err() != nil {
			return nil // the caller reports the stop once
		}
		if err := diskio.WillNeed(f, off, min(chunk, fi.Size()-off)); err != nil {
			return err
		}
	}
	return nil
}
