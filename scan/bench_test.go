package scan_test

import (
	"bytes"
	"testing"

	"github.com/modelpack/modelpack/scan"
)

// BenchmarkPickleOpcodes is the parser's own speed on small opcodes (make bench prints it on 256 MiB).
func BenchmarkPickleOpcodes(b *testing.B) {
	var w bytes.Buffer
	w.WriteString("\x80\x04]")
	for w.Len() < 32<<20 {
		w.WriteString("(")
		for i := 0; i < 1000; i++ {
			w.WriteString("K\x07")
		}
		w.WriteString("e")
	}
	w.WriteString(".")
	b.SetBytes(int64(w.Len()))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := scan.File(bytes.NewReader(w.Bytes()), int64(w.Len()))
		if r.Verdict != scan.Data {
			b.Fatal(r)
		}
	}
}
