package cache

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/modelpack/modelpack/artifact"
)

// BenchmarkViewAssembly times assembling a fresh view of a 1,000-file model (one raw layer per file, as packers
// that give every file its own layer produce) and of a model whose 1,000 files are in one tar layer.
func BenchmarkViewAssembly(b *testing.B) {
	for _, tarred := range []bool{false, true} {
		b.Run(fmt.Sprintf("tar=%v", tarred), func(b *testing.B) {
			src := newMemTarget()
			var files []modelFile
			var entries []tarEntry
			for i := range 1000 {
				name := fmt.Sprintf("extra/part-%05d.json", i)
				body := fmt.Sprintf("{\"i\":%d}\n", i)
				files = append(files, modelFile{Path: name, Data: []byte(body)})
				entries = append(entries, tarEntry{Name: name, Body: body})
			}
			if tarred {
				files = []modelFile{{Path: "extra", Data: makeTar(b, true, entries...), Kind: artifact.KindWeightConfig, Format: artifact.FormatTarGzip}}
			}
			desc := src.manifestDesc(modelManifest(b, src, files))
			c := openCache(b, b.TempDir(), Options{})
			if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				if _, err := c.Acquire(fmt.Sprintf("v%d", i), desc.Digest, Selector{Include: []string{"**", fmt.Sprint(i)}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkScrub measures what the scrub costs per GiB, unpaced, on its idle-priority thread: CPU-seconds (the
// process's, from getrusage) and wall time, with the blob in the page cache (warm) and dropped from it first
// (cold: POSIX_FADV_DONTNEED on the flushed blob, so the bytes come from the disk).
func BenchmarkScrub(b *testing.B) {
	const size = 1 << 30
	c := openCache(b, b.TempDir(), Options{ScrubRate: -1})
	r := io.LimitReader(rand.NewChaCha8([32]byte{1}), size)
	d, _, err := c.blobs.Write(context.Background(), bufio.NewReaderSize(r, 1<<20))
	if err != nil {
		b.Fatal(err)
	}
	if err := c.blobs.Sync(); err != nil {
		b.Fatal(err)
	}
	for _, cold := range []bool{false, true} {
		b.Run(fmt.Sprintf("cold=%v", cold), func(b *testing.B) {
			var cpu, wall time.Duration
			for range b.N {
				if cold {
					f, err := os.Open(c.blobs.Path(d))
					if err != nil {
						b.Fatal(err)
					}
					unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
					f.Close()
				}
				before := cpuTime(b)
				start := time.Now()
				if _, err := c.scrub(context.Background()); err != nil {
					b.Fatal(err)
				}
				wall += time.Since(start)
				cpu += cpuTime(b) - before
			}
			gib := float64(b.N) * float64(size) / (1 << 30)
			b.ReportMetric(cpu.Seconds()/gib, "cpu-s/GiB")
			b.ReportMetric(wall.Seconds()/gib, "wall-s/GiB")
		})
	}
}

func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
