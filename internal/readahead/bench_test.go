package readahead

import (
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/modelpack/modelpack/internal/testenv"
)

// BenchmarkReadahead compares, for 4 files of 256 MiB out of the page cache (a warm model on disk), reading them
// one after the other from the disk with the readahead bringing them all into memory: its ratio is the time
// until every page is resident over the sequential read's.
//
//	go test ./internal/readahead -run - -bench Readahead -benchtime 3x
func BenchmarkReadahead(b *testing.B) {
	dir := b.TempDir()
	var paths []string
	for i := range 4 {
		paths = append(paths, writeFile(b, dir, fmt.Sprintf("shard%d", i), 256<<20))
	}
	evict := func() {
		for _, p := range paths {
			testenv.EvictPages(b, p)
		}
	}
	var seq, ahead time.Duration
	for b.Loop() {
		evict()
		start := time.Now()
		for _, p := range paths {
			f, err := os.Open(p)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(io.Discard, f); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
		seq += time.Since(start)

		evict()
		drops := testenv.PageCacheDrops(b)
		start = time.Now()
		redo := func() { runOnce(b, dir, Fixed(1<<40)) }
		redo()
		for _, p := range paths {
			testenv.WaitResident(b, p, drops, redo)
		}
		ahead += time.Since(start)
	}
	b.ReportMetric(seq.Seconds()/float64(b.N), "sequential-s")
	b.ReportMetric(ahead.Seconds()/float64(b.N), "readahead-s")
	b.ReportMetric(ahead.Seconds()/seq.Seconds(), "ratio")
}
