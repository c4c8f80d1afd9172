package scan_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/scan"
)

//go:generate python3 testdata/gen.py

// expectation is one vector's entry in testdata/vectors/expect.json, written by gen.py beside the file.
type expectation struct {
	Format   string       `json:"format"`
	Verdict  scan.Verdict `json:"verdict"`
	Callable string       `json:"callable"`
	Note     string       `json:"note"`
}

func scanFile(t *testing.T, path string) scan.Report {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return scan.File(f, st.Size())
}

// TestVectors scans every generated vector, hostile and benign, and checks format, verdict and the callable named.
func TestVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/vectors/expect.json")
	if err != nil {
		t.Fatalf("%v (run go generate ./scan/)", err)
	}
	var want map[string]expectation
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	if len(want) < 40 {
		t.Fatalf("expect.json lists %d vectors", len(want))
	}
	for name, w := range want {
		t.Run(name, func(t *testing.T) {
			rep := scanFile(t, filepath.Join("testdata/vectors", name))
			if rep.Format != w.Format || rep.Verdict != w.Verdict {
				t.Fatalf("got %s/%s (%s), want %s/%s\n%+v", rep.Format, rep.Verdict, rep.Reason, w.Format, w.Verdict, rep.Findings)
			}
			if w.Verdict != scan.Data && rep.Reason == "" {
				t.Errorf("%s without a reason", rep.Verdict)
			}
			if w.Callable != "" {
				var names []string
				for _, f := range rep.Findings {
					if f.Verdict == scan.Code {
						names = append(names, f.Callable)
					}
				}
				if !strings.Contains(strings.Join(names, " "), w.Callable) {
					t.Errorf("code findings name %v, want %s among them", names, w.Callable)
				}
			}
		})
	}
}
