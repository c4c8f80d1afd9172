// Package readahead warms the page cache with the files of a published volume that its pod has not started
// reading yet. An inference server opens its weights seconds after its container starts (its imports, its
// device's set-up); reads the driver asks for meanwhile, many files deep, find the node idle and leave the files
// in memory by then, where a native image volume's reader starts from the disk. It only ever reads: files are
// opened read-only and never through a symbolic link, and the kernel is told which bytes will be needed (fadvise
// WILLNEED), so nothing is copied and no thread waits for the disk.
//
// When is measured (issue 20's cluster bench, BENCH_EXPERIMENT=readahead: warm pods in one cluster, against the
// native image volume). Read ahead at the mount, it delays the pod's sandbox and container, started from the same
// disk and two vCPUs meanwhile, by more than it spares the pod's reads (1.03×–1.13×); beside a pod already reading,
// it slows those reads (1.11×–1.13×); off, 0.93×–0.98×. So a readahead waits (Options.WaitForOpen, the driver's
// --readahead-wait) and is dropped if the pod opens a file of the volume meanwhile: that pod reads its model itself,
// as fast as the node can (0.99×); a pod that reads 5 s after its start finds its model in memory (0.90×, off 0.98×).
//
// It advises at the normal I/O priority, four files deep: every gentler way measured slower at the mount (1.06× at
// the idle I/O class; 1.10× one file a readahead window at a time; 1.47× with 512 KiB reads one at a time; the idle
// CPU scheduling class no better).
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
	// Files and Bytes were handed to the kernel; Skipped and SkippedBytes were left out, being over Budget. A
	// readahead stopped early counts only what it handed over.
	Files, Skipped      int
	Bytes, SkippedBytes int64
	// Uncached are the bytes, of Bytes, that were not in the page cache: the kernel was asked to read them.
	Uncached int64
	Budget   int64
	// Duration is the time to hand every read to the kernel, which may still be completing some.
	Duration time.Duration
	// Err is the first failure (a file that vanished, a stop); the other files were still read.
	Err error
	// Waited is how long the readahead waited (Options.WaitForOpen), Opened whether an open ended the wait (and
	// the readahead: it then read nothing), and WaitErr why it could not wait (no inotify; it then started at once).
	Waited  time.Duration
	Opened  bool
	WaitErr error
}

// Options configure a Reader.
type Options struct {
	// Budget is asked at the start of each readahead; required.
	Budget Budget
	// Done, if set, receives each readahead's Result.
	Done func(Result)
	// Gate, if set, is called by each readahead before it reads anything (tests hold readaheads with it).
	Gate func(dir string)
	// WaitForOpen, if above 0, holds each readahead for that long, and drops it if a file of its directory is
	// opened meanwhile: that pod reads its model itself. Measured on the cluster bench (README, Performance), a
	// readahead at the mount delays the pod's sandbox and container by more than it spares its reads, and one
	// beside a pod's own reads slows them; a pod that has not opened its model by then is busy elsewhere (an
	// inference server's imports), and the readahead has its weights in memory by the time it opens them.
	WaitForOpen time.Duration
}

// Reader runs readaheads, one at a time per directory.
type Reader struct {
	ctx  context.Context
	opts Options

	mu      sync.Mutex
	running map[string]*run
	wg      sync.WaitGroup
}

type run struct{ cancel context.CancelFunc }

// New returns a Reader whose readaheads stop when ctx ends.
func New(ctx context.Context, opts Options) *Reader {
	return &Reader{ctx: ctx, opts: opts, running: map[string]*run{}}
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
		if r.opts.Done != nil {
			r.opts.Done(res)
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
	if r.opts.Gate != nil {
		r.opts.Gate(dir)
	}
	res := Result{Dir: dir}
	if r.opts.WaitForOpen > 0 {
		waiting := time.Now()
		res.Opened, res.WaitErr = firstOpen(ctx, dir, r.opts.WaitForOpen)
		res.Waited = time.Since(waiting)
		if res.Opened {
			return res
		}
	}
	start := time.Now()
	res.Budget = r.opts.Budget()
	files, err := list(dir)
	res.Err = err
	var todo []file
	var planned int64
	for i, f := range files {
		if planned+f.size > res.Budget {
			for _, s := range files[i:] {
				res.Skipped++
				res.SkippedBytes += s.size
			}
			break
		}
		todo = append(todo, f)
		planned += f.size
	}

	type done struct {
		n, asked int64
		err      error
	}
	queue := make(chan file)
	dones := make(chan done, len(todo))
	var wg sync.WaitGroup
	for range min(workers, len(todo)) {
		wg.Go(func() {
			for f := range queue {
				n, asked, err := advise(ctx, f.path)
				dones <- done{n, asked, err}
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
	close(dones)
	for d := range dones {
		if d.err == nil && ctx.Err() == nil {
			res.Files++
		}
		res.Bytes += d.n
		res.Uncached += d.asked
		res.Err = cmp.Or(res.Err, d.err)
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

// advise hands the kernel the reads of one file, a chunk at a time so that a stop is heard between chunks, and
// returns the bytes handed over and, of those, the bytes not in the page cache already.
func advise(ctx context.Context, path string) (done, asked int64, err error) {
	// O_NOFOLLOW: a file swapped for a link after the walk is refused, not followed.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return 0, 0, err
	}
	for done < fi.Size() {
		if ctx.Err() != nil {
			return done, asked, nil // the caller reports the stop once
		}
		n := min(chunk, fi.Size()-done)
		a, err := diskio.WillNeed(f, done, n)
		asked += a
		if err != nil {
			return done, asked, err
		}
		done += n
	}
	return done, asked, nil
}
