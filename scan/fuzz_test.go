package scan_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/scan"
)

// Every parser is fuzzed from the generated vectors of its format: no input may panic, hang past the fuzzer's
// deadline or give a verdict outside the three, and a scan is deterministic.
func fuzzFormat(f *testing.F, suffixes ...string) {
	ents, _ := os.ReadDir("testdata/vectors")
	for _, e := range ents {
		for _, s := range suffixes {
			if strings.HasSuffix(e.Name(), s) {
				b, err := os.ReadFile(filepath.Join("testdata/vectors", e.Name()))
				if err != nil {
					f.Fatal(err)
				}
				f.Add(b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r := scan.File(bytes.NewReader(b), int64(len(b)))
		switch r.Verdict {
		case scan.Data, scan.Code, scan.Malformed:
		default:
			t.Fatalf("verdict %q", r.Verdict)
		}
		if r.Verdict != scan.Data && r.Reason == "" {
			t.Fatalf("%s without a reason: %+v", r.Verdict, r)
		}
		if again := scan.File(bytes.NewReader(b), int64(len(b))); again.Verdict != r.Verdict || again.Reason != r.Reason {
			t.Fatalf("two scans disagree: %+v, %+v", r, again)
		}
	})
}

func FuzzPickle(f *testing.F)      { fuzzFormat(f, ".pkl", ".joblib") }
func FuzzZip(f *testing.F)         { fuzzFormat(f, ".pt", ".npz", ".keras") }
func FuzzSafetensors(f *testing.F) { fuzzFormat(f, ".safetensors") }
func FuzzGGUF(f *testing.F)        { fuzzFormat(f, ".gguf") }
func FuzzNpy(f *testing.F)         { fuzzFormat(f, ".npy") }
func FuzzONNX(f *testing.F)        { fuzzFormat(f, ".onnx", ".h5") }
