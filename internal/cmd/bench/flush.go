package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/bench"
	"github.com/modelpack/modelpack/internal/diskio"
)

// benchFlush: what the background flush of a just-pulled model does to a durable record write beside it (a
// publish's metadata commit, the driver's volume record). The model's weight files are written into a fresh
// cas.Store (page cache dropped first), then flushed
//
//   - not at all: the floor, the record write with the bytes still dirty in memory;
//   - a blob at a time in 8 MiB write-back chunks, one fdatasync per blob: the flusher before issue 20's pacing,
//     the peer;
//   - by the store itself (cas.Store.Sync: write-back chunks, each followed by a flush of the disk's write cache),
//
// while a loop writes a 300-byte record durably (temporary file, fsync, rename, directory fsync) every 20 ms.
// It prints the record writes' p50/p99 and the flush's time, medians over RUNS (3) rotated rounds.
func benchFlush(e *env) error {
	runs := envInt("RUNS", 3)
	d, _, err := e.scratch("flush")
	if err != nil {
		return err
	}
	defer os.RemoveAll(d)
	weights, err := weightFiles(e.modelDir)
	if err != nil {
		return err
	}
	// The store's own background flush must not start while the peers run: only Sync flushes here.
	defer func(old time.Duration) { cas.FlushDelay = old }(cas.FlushDelay)
	cas.FlushDelay = time.Hour

	type figures struct{ p50, p99, flush []float64 }
	res := map[string]*figures{}
	modes := []string{"none", "per-blob", "store"}
	for _, m := range modes {
		res[m] = &figures{}
	}
	for i := 1; i <= runs; i++ {
		var fns []func() error
		for _, m := range modes {
			fns = append(fns, func() error {
				p50, p99, took, err := flushRound(filepath.Join(d, m), weights, m)
				if err != nil {
					return fmt.Errorf("%s: %w", m, err)
				}
				f := res[m]
				f.p50, f.p99, f.flush = append(f.p50, p50), append(f.p99, p99), append(f.flush, took)
				fmt.Fprintf(os.Stderr, "flush round %d %-8s record p50 %.1f ms p99 %.1f ms, flush %.2f s\n", i, m, p50, p99, took)
				return nil
			})
		}
		if err := bench.Rotate(i, fns...); err != nil {
			return err
		}
	}
	med := func(m string) (p50, p99, flush float64) {
		return bench.Median(res[m].p50), bench.Median(res[m].p99), bench.Median(res[m].flush)
	}
	fmt.Printf("a durable 300-byte record write while %s of fresh blobs are flushed (medians of %d rotated rounds)\n", e.size, runs)
	_, peer, _ := med("per-blob")
	for _, m := range []struct{ key, label string }{
		{"none", "no flush (the floor)"},
		{"per-blob", "8 MiB chunks, one cache flush per blob (peer)"},
		{"store", "cas.Store.Sync (paced)"},
	} {
		p50, p99, took := med(m.key)
		flush := "-"
		if m.key != "none" {
			flush = bench.Secs(took) + "s"
		}
		fmt.Printf("%-48s record p50 %6.1f ms  p99 %6.1f ms (%s× the peer's)  flush %s\n", m.label, p50, p99, bench.Ratio(p99, peer), flush)
	}
	return nil
}

// flushRound writes the weights into a fresh store under dir and flushes them as mode says, with the record loop
// running beside; it returns the loop's p50 and p99 in milliseconds and the flush's seconds.
func flushRound(dir string, weights []string, mode string) (p50, p99, took float64, err error) {
	os.RemoveAll(dir)
	defer fresh(dir)
	s, err := cas.Open(filepath.Join(dir, "store"))
	if err != nil {
		return 0, 0, 0, err
	}
	syscall.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		return 0, 0, 0, fmt.Errorf("drop the page cache (needs root): %w", err)
	}
	var blobs []string
	for _, w := range weights {
		f, err := os.Open(w)
		if err != nil {
			return 0, 0, 0, err
		}
		dg, _, err := s.Write(context.Background(), f)
		f.Close()
		if err != nil {
			return 0, 0, 0, err
		}
		blobs = append(blobs, s.Path(dg))
	}

	records := filepath.Join(dir, "records")
	if err := os.MkdirAll(records, 0o755); err != nil {
		return 0, 0, 0, err
	}
	stop := make(chan struct{})
	var lat []float64
	var wg sync.WaitGroup
	var loopErr error
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			t := time.Now()
			if err := diskio.WriteFileAtomic(filepath.Join(records, "volume.json"), make([]byte, 300), 0o600); err != nil {
				loopErr = err
				return
			}
			lat = append(lat, float64(time.Since(t).Microseconds())/1000)
			time.Sleep(20 * time.Millisecond)
		}
	})
	start := time.Now()
	switch mode {
	case "none":
		time.Sleep(3 * time.Second)
	case "per-blob":
		err = flushPerBlob(blobs)
	case "store":
		err = s.Sync()
	}
	took = time.Since(start).Seconds()
	close(stop)
	wg.Wait()
	if err == nil {
		err = loopErr
	}
	if err != nil {
		return 0, 0, 0, err
	}
	if len(lat) == 0 {
		return 0, 0, 0, fmt.Errorf("no record written during the flush")
	}
	return bench.Median(lat), percentile(lat, 0.99), took, nil
}

// flushPerBlob is the flusher before pacing: each blob written back in 8 MiB chunks, then one fdatasync.
func flushPerBlob(paths []string) error {
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		fi, err := f.Stat()
		if err == nil {
			for off := int64(0); off < fi.Size() && err == nil; off += 8 << 20 {
				err = diskio.WriteBack(f, off, min(8<<20, fi.Size()-off))
			}
		}
		if err == nil {
			err = diskio.Fdatasync(f)
		}
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// weightFiles are the model's regular files of 1 MiB or more.
func weightFiles(dir string) ([]string, error) {
	var out []string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && fi.Size() >= 1<<20 {
			out = append(out, p)
		}
		return err
	})
	return out, err
}
