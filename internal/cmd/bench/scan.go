package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	humanize "github.com/dustin/go-humanize"

	"github.com/modelpack/modelpack/internal/bench"
	"github.com/modelpack/modelpack/scan"
)

// benchScan: the scanner's throughput on the benchmark model (safetensors: headers only), on a generated pickle
// of the same size holding its tensors inline (a state dict written by pickle, not torch.save: the payloads are
// skipped, not read), and on a pickle of dense opcodes (the parser's own speed); then what a scan adds to a cold
// pull of the model (a cold publish without the driver: pull into a fresh store, then scan its blobs where they
// lie), medians of RUNS (3). Throughput counts the file bytes a scan vouches for, per second of wall time.
func benchScan(e *env) error {
	runs := envInt("RUNS", 3)
	scratch, _, err := e.scratch("bench-scan")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	modelBytes, err := treeBytes(e.modelDir)
	if err != nil {
		return err
	}
	inline := filepath.Join(e.work, "scan-inline-"+humanize.IBytes(uint64(modelBytes))+".pkl")
	if err := inlinePickle(inline, modelBytes); err != nil {
		return err
	}
	dense := filepath.Join(scratch, "dense.pkl")
	denseBytes, err := densePickle(dense, 256<<20)
	if err != nil {
		return err
	}
	rate := func(what string, bytes int64, fn func() ([]scan.FileReport, error)) error {
		var secs []float64
		for range runs {
			var reps []scan.FileReport
			t, err := bench.Time(func() (err error) { reps, err = fn(); return err })
			if err != nil {
				return err
			}
			if scan.Refused(reps) {
				return fmt.Errorf("%s: the benchmark input is not data: %+v", what, reps)
			}
			secs = append(secs, t)
		}
		s := bench.Median(secs)
		fmt.Printf("%-44s %10.2f GiB/s  (%s in %s s; rounds %s)\n", what, float64(bytes)/s/(1<<30), humanize.IBytes(uint64(bytes)), bench.Secs(s), bench.Runs(secs))
		return nil
	}
	one := func(p string) func() ([]scan.FileReport, error) {
		return func() ([]scan.FileReport, error) {
			f, err := os.Open(p)
			if err != nil {
				return nil, err
			}
			defer f.Close()
			st, _ := f.Stat()
			return []scan.FileReport{{Path: p, Size: st.Size(), Report: scan.File(f, st.Size())}}, nil
		}
	}
	fmt.Printf("scan (medians of %d rounds)\n", runs)
	if err := rate("safetensors model ("+e.size+"), headers:", modelBytes, func() ([]scan.FileReport, error) { return scan.Dir(e.modelDir) }); err != nil {
		return err
	}
	if err := rate("pickle with inline tensors ("+humanize.IBytes(uint64(modelBytes))+"):", modelBytes, one(inline)); err != nil {
		return err
	}
	if err := rate("pickle of dense opcodes ("+humanize.IBytes(uint64(denseBytes))+"):", denseBytes, one(dense)); err != nil {
		return err
	}

	// Cold pull with and without the scan of what it pulled, interleaved.
	var plain, scanned, scanOnly []float64
	for round := range runs {
		err := bench.Rotate(round, func() error {
			home := filepath.Join(scratch, "home")
			fresh(home)
			defer os.RemoveAll(home)
			t, err := timed(exec.Command("modelpack", "pull", e.ref, "--plain-http", "-q"), "MODELPACK_HOME="+home)
			plain = append(plain, t)
			return err
		}, func() error {
			home := filepath.Join(scratch, "home")
			fresh(home)
			defer os.RemoveAll(home)
			t, err := timed(exec.Command("modelpack", "pull", e.ref, "--plain-http", "-q"), "MODELPACK_HOME="+home)
			if err != nil {
				return err
			}
			ts, err := bench.Time(func() error {
				reps, err := scan.Dir(filepath.Join(home, "blobs"))
				if err == nil && scan.Refused(reps) {
					err = fmt.Errorf("pulled blobs are not data: %+v", reps)
				}
				return err
			})
			scanned, scanOnly = append(scanned, t+ts), append(scanOnly, ts)
			return err
		})
		if err != nil {
			return err
		}
	}
	// The two pulls differ by the machine's noise; the scan's own time is the cost, and its share of a pull.
	tp, ts, so := bench.Median(plain), bench.Median(scanned), bench.Median(scanOnly)
	fmt.Printf("%-44s %8.3f s vs %8.3f s without  %5sx  (rounds %s / %s)\n", "cold pull + scan of its blobs, "+e.size+":", ts, tp, bench.Ratio(ts, tp), bench.Runs(scanned), bench.Runs(plain))
	fmt.Printf("%-44s %8.1f ms  = %.3f %% of the pull  (target: not measurable, < 1 %%)\n", "the scan's own time in that publish:", so*1000, 100*so/tp)
	return nil
}

func treeBytes(dir string) (int64, error) {
	reps, err := scan.Dir(dir)
	var n int64
	for _, r := range reps {
		n += r.Size
	}
	return n, err
}

// inlinePickle writes, once, a protocol-4 pickle of about size bytes: an OrderedDict of 1 MiB tensors rebuilt by
// torch._utils._rebuild_tensor_v2 from bytes held in the stream (BINBYTES8).
func inlinePickle(path string, size int64) error {
	if st, err := os.Stat(path); err == nil && st.Size() > size/2 {
		return nil
	}
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	w.WriteString("\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00") // PROTO 4, an empty FRAME
	w.WriteString("ccollections\nOrderedDict\n)R(")
	w.WriteString("ctorch._utils\n_rebuild_tensor_v2\n\x94") // memo 0
	chunk := make([]byte, 1<<20)
	var n8 [8]byte
	for i := 0; int64(i)*int64(len(chunk)) < size; i++ {
		key := fmt.Sprintf("layers.%d.weight", i)
		w.WriteString("\x8c" + string(rune(len(key))) + key)
		w.WriteString("h\x00(\x8e")
		binary.LittleEndian.PutUint64(n8[:], uint64(len(chunk)))
		w.Write(n8[:])
		w.Write(chunk)
		w.WriteString("K\x00J\x00\x00\x04\x00\x85K\x01\x85\x89)tR")
	}
	w.WriteString("u.")
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// densePickle writes a pickle of about size bytes of small opcodes only: lists of ints, appended in batches of
// 1000 as pickle writes them.
func densePickle(path string, size int64) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	w.WriteString("\x80\x04]")
	var n int64 = 3
	for n < size {
		w.WriteString("(")
		for i := 0; i < 1000; i++ {
			w.WriteString("K\x07")
		}
		w.WriteString("e")
		n += 2002
	}
	w.WriteString(".")
	return n + 1, w.Flush()
}
