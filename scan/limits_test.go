package scan_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/scan"
)

// heapDuring reports the bytes allocated while fn runs.
func heapDuring(fn func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	fn()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// A hostile pickle that pushes millions of values, memoizes millions of entries or declares gigabyte strings is
// malformed at the limit and costs a bounded amount of memory, whatever its size.
func TestHostilePickleIsBounded(t *testing.T) {
	cases := map[string][]byte{
		"stack":  append([]byte("\x80\x04"), bytes.Repeat([]byte("]"), 4<<20)...),
		"memo":   append([]byte("\x80\x04]"), bytes.Repeat([]byte("\x94"), 4<<20)...),
		"marks":  append([]byte("\x80\x04"), bytes.Repeat([]byte("("), 4<<20)...),
		"string": []byte("\x80\x04\x8e\xff\xff\xff\xff\xff\xff\xff\x00."),
		"frame":  []byte("\x80\x04\x95\xff\xff\xff\xff\xff\xff\x00\x00N."),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			var r scan.Report
			alloc := heapDuring(func() { r = scan.File(bytes.NewReader(b), int64(len(b))) })
			if r.Verdict != scan.Malformed {
				t.Fatalf("verdict %s (%s)", r.Verdict, r.Reason)
			}
			if alloc > 32<<20 {
				t.Errorf("allocated %d MiB", alloc>>20)
			}
			t.Logf("%s: %s, %d KiB allocated", r.Verdict, r.Reason, alloc>>10)
		})
	}
}

// Large string payloads (tensors pickled inline) are read through, not kept.
func TestLargePickleStringsAreNotKept(t *testing.T) {
	payload := bytes.Repeat([]byte{1}, 16<<20)
	var b bytes.Buffer
	b.WriteString("\x80\x04")
	for i := 0; i < 4; i++ {
		b.WriteString("\x8e")
		n := uint64(len(payload))
		for j := 0; j < 8; j++ {
			b.WriteByte(byte(n >> (8 * j)))
		}
		b.Write(payload)
		b.WriteString("0")
	}
	b.WriteString("N.")
	var r scan.Report
	alloc := heapDuring(func() { r = scan.File(bytes.NewReader(b.Bytes()), int64(b.Len())) })
	if r.Verdict != scan.Data {
		t.Fatalf("verdict %s (%s)", r.Verdict, r.Reason)
	}
	if alloc > 8<<20 {
		t.Errorf("a 64 MiB pickle allocated %d MiB", alloc>>20)
	}
}

// Formats are found by content inside containers: a PyTorch archive inside a tar layer, inside gzip.
func TestContainersByContent(t *testing.T) {
	evil, err := os.ReadFile("testdata/vectors/evil_torch.pt")
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.ReadFile("testdata/vectors/ok.safetensors")
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for _, f := range []struct {
		name string
		b    []byte
	}{{"model/model.safetensors", st}, {"model/weights.txt", evil}} {
		tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.b)), Typeflag: tar.TypeReg})
		tw.Write(f.b)
	}
	tw.Close()
	r := scan.File(bytes.NewReader(tb.Bytes()), int64(tb.Len()))
	if r.Format != "tar" || r.Verdict != scan.Code || r.FirstCallable() != "posix.system" {
		t.Fatalf("tar: %+v", r)
	}
	if !strings.HasPrefix(r.Reason, "model/weights.txt: archive/data.pkl: ") || r.Findings[len(r.Findings)-1].File != "model/weights.txt" {
		t.Errorf("reason %q does not name the file and member: %+v", r.Reason, r.Findings)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tb.Bytes())
	zw.Close()
	r = scan.File(bytes.NewReader(gz.Bytes()), int64(gz.Len()))
	if r.Format != "gzip+tar" || r.Verdict != scan.Code {
		t.Fatalf("gzip: %+v", r)
	}
}

// The allowlist is the verdict: only names on it are data, and the torch rebuild helpers are on it.
func TestAllowlist(t *testing.T) {
	for _, ok := range []string{"torch._utils._rebuild_tensor_v2", "collections.OrderedDict", "torch.FloatStorage", "numpy.core.multiarray._reconstruct"} {
		if _, allowed := scan.Allowed(ok); !allowed {
			t.Errorf("%s not allowed", ok)
		}
	}
	for _, bad := range []string{"os.system", "builtins.eval", "builtins.getattr", "torch._utils._rebuild_tensor_v2.__globals__", "torch.load", "numpy.load"} {
		if _, allowed := scan.Allowed(bad); allowed {
			t.Errorf("%s allowed", bad)
		}
	}
}

// BUILD on an imported global itself (rewriting a function's defaults, a class's attributes) is code even when the
// global is allowed.
func TestBuildOnGlobalIsCode(t *testing.T) {
	b := []byte("\x80\x02ctorch._utils\n_rebuild_tensor_v2\n}X\x0c\x00\x00\x00__defaults__Nsb.")
	r := scan.File(bytes.NewReader(b), int64(len(b)))
	if r.Verdict != scan.Code {
		t.Fatalf("%+v", r)
	}
}

// Text is not mistaken for a protocol-0 pickle unless it is one: a LICENSE that starts like GLOBAL is text; a
// protocol-0 payload cut short after its call is code.
func TestProtocol0OrText(t *testing.T) {
	for in, want := range map[string]string{
		"copyright\nMIT\nPermission is hereby granted\n": "text/data",
		"(c) 2024 Example\n":                             "text/data",
		"I love models\n":                                "text/data",
		"cos\nsystem\n(S'id'\ntR":                        "pickle/code",
		"cos\nsystem\n(S'id'\ntR\xff\xfe":                "pickle/code",
		"N.":                                             "pickle/data",
	} {
		r := scan.File(strings.NewReader(in), int64(len(in)))
		if got := r.Format + "/" + string(r.Verdict); got != want {
			t.Errorf("%q: %s (%s), want %s", in, got, r.Reason, want)
		}
	}
}

// Dir follows links to regular files (the Hugging Face cache's layout) and refuses others.
func TestDirLinks(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(dir+"/blob", []byte(`{"a":1}`), 0o644)
	os.Mkdir(dir+"/snap", 0o755)
	os.Symlink("../blob", dir+"/snap/config.json")
	os.Symlink("/nonexistent", dir+"/snap/dangling")
	reps, err := scan.Dir(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range reps {
		got[r.Path] = r.Format + "/" + string(r.Verdict)
	}
	if got["snap/config.json"] != "json/data" || got["snap/dangling"] != "symlink/malformed" || got["blob"] != "json/data" {
		t.Fatalf("%v", got)
	}
}
