package scan_test

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/scan"
)

// zipOf writes files (name, content) with Go's archive/zip: deflated entries with data descriptors, as many
// writers stream them; stored ones with their sizes up front.
func zipOf(t *testing.T, method uint16, files ...string) []byte {
	t.Helper()
	var b bytes.Buffer
	w := zip.NewWriter(&b)
	for i := 0; i < len(files); i += 2 {
		f, err := w.CreateHeader(&zip.FileHeader{Name: files[i], Method: method})
		if err != nil {
			t.Fatal(err)
		}
		f.Write([]byte(files[i+1]))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func vector(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/vectors/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func scanBytes(b []byte) scan.Report { return scan.File(bytes.NewReader(b), int64(len(b))) }

// Deflated entries with data descriptors (Go, Java and streaming writers) are read, each scanned by content.
func TestZipDeflateAndDescriptors(t *testing.T) {
	good := zipOf(t, zip.Deflate, "archive/data.pkl", vector(t, "state_dict.pkl"), "archive/data/0", strings.Repeat("\x00", 4096), "archive/version", "3\n")
	if r := scanBytes(good); r.Format != "pytorch-zip" || r.Verdict != scan.Data {
		t.Fatalf("deflated torch archive: %+v", r)
	}
	evil := zipOf(t, zip.Deflate, "archive/data.pkl", vector(t, "reduce_os_system.pkl"))
	if r := scanBytes(evil); r.Verdict != scan.Code || r.FirstCallable() != "posix.system" {
		t.Fatalf("deflated evil archive: %+v", r)
	}
	// A member that is not named .pkl is still found by its content (a pickle in a ZIP in a ZIP).
	nested := zipOf(t, zip.Store, "inner.bin", string(evil))
	if r := scanBytes(nested); r.Verdict != scan.Code || !strings.HasPrefix(r.Reason, "inner.bin/archive/data.pkl: ") {
		t.Fatalf("nested archive: %+v", r)
	}
}

// centralEntries returns where the central directory starts and where each of its entries is.
func centralEntries(b []byte) (cdOff int, entries []int) {
	end := bytes.LastIndex(b, []byte("PK\x05\x06"))
	cdOff = int(binary.LittleEndian.Uint32(b[end+16:]))
	for p := cdOff; p < end; {
		entries = append(entries, p)
		n, e, c := int(binary.LittleEndian.Uint16(b[p+28:])), int(binary.LittleEndian.Uint16(b[p+30:])), int(binary.LittleEndian.Uint16(b[p+32:]))
		p += 46 + n + e + c
	}
	return cdOff, entries
}

// Bytes no entry accounts for, entries that overlap, trailing bytes after the end record, unknown methods and the
// wrong CRC of a member read whole (pickles, deflated members) are malformed: each is a place where two ZIP readers
// can see different files, or none.
func TestZipStructureDisagreements(t *testing.T) {
	base := zipOf(t, zip.Store, "a.json", `{"a":1}`, "b.json", `{"b":2}`)
	if r := scanBytes(base); r.Verdict != scan.Data {
		t.Fatalf("base: %+v", r)
	}
	le := binary.LittleEndian
	cases := map[string]func([]byte) []byte{
		"gap before an entry": func(b []byte) []byte {
			_, ents := centralEntries(b)
			second := int(le.Uint32(b[ents[1]+42:]))
			out := append(append(append([]byte{}, b[:second]...), make([]byte, 16)...), b[second:]...)
			cd := bytes.LastIndex(out, []byte("PK\x05\x06"))
			le.PutUint32(out[cd+16:], le.Uint32(out[cd+16:])+16)
			_, ents = centralEntries(out)
			le.PutUint32(out[ents[1]+42:], le.Uint32(out[ents[1]+42:])+16)
			return out
		},
		"overlapping entries": func(b []byte) []byte {
			_, ents := centralEntries(b)
			le.PutUint32(b[ents[1]+42:], le.Uint32(b[ents[0]+42:]))
			return b
		},
		"trailing bytes": func(b []byte) []byte { return append(b, "junk"...) },
		"bytes before the first entry": func(b []byte) []byte {
			return append([]byte("\x00\x01\x02\x03"), b...)
		},
		"CRC mismatch of a pickle": func([]byte) []byte {
			b := zipOf(t, zip.Store, "archive/data.pkl", "\x80\x02K\x01.")
			i := bytes.Index(b, []byte("\x80\x02K\x01."))
			b[i+3] = 2 // still a valid pickle, no longer the bytes the CRC covers
			return b
		},
		"compression method": func(b []byte) []byte {
			_, ents := centralEntries(b)
			le.PutUint16(b[ents[0]+10:], 12) // bzip2
			le.PutUint16(b[8:], 12)
			return b
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			r := scanBytes(mutate(append([]byte{}, base...)))
			if r.Verdict != scan.Malformed {
				t.Fatalf("%+v", r)
			}
			t.Log(r.Reason)
		})
	}
}

// safetensors: a gap between tensors, a duplicate name and data after the last tensor are malformed, as
// safetensors' own validation says.
func TestSafetensorsChecks(t *testing.T) {
	st := func(h string, data int) []byte {
		b := make([]byte, 8, 8+len(h)+data)
		binary.LittleEndian.PutUint64(b, uint64(len(h)))
		return append(append(b, h...), make([]byte, data)...)
	}
	for name, c := range map[string]struct {
		b    []byte
		want scan.Verdict
	}{
		"ok":         {st(`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"I8","shape":[4],"data_offsets":[4,8]}}  `, 8), scan.Data},
		"gap":        {st(`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"I8","shape":[4],"data_offsets":[6,10]}}`, 10), scan.Malformed},
		"duplicate":  {st(`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"a":{"dtype":"I8","shape":[4],"data_offsets":[4,8]}}`, 8), scan.Malformed},
		"trailing":   {st(`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, 8), scan.Malformed},
		"bad dtype":  {st(`{"a":{"dtype":"PY","shape":[2],"data_offsets":[0,4]}}`, 4), scan.Malformed},
		"overflow":   {st(`{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, 0), scan.Malformed},
		"after json": {st(`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}{}`, 4), scan.Malformed},
	} {
		r := scanBytes(c.b)
		if r.Format != "safetensors" || r.Verdict != c.want {
			t.Errorf("%s: %s/%s (%s), want safetensors/%s", name, r.Format, r.Verdict, r.Reason, c.want)
		}
	}
}

// More entries than a plain end record counts: the zip64 end record and its locator are followed.
func TestZip64EndRecord(t *testing.T) {
	var b bytes.Buffer
	w := zip.NewWriter(&b)
	for i := 0; i < 65536; i++ {
		f, _ := w.CreateHeader(&zip.FileHeader{Name: "f/" + strconv.Itoa(i) + ".json", Method: zip.Store})
		f.Write([]byte("{}"))
	}
	w.Close()
	if !bytes.Contains(b.Bytes(), []byte("PK\x06\x06")) {
		t.Fatal("no zip64 end record written")
	}
	lim := scan.DefaultLimits
	lim.MaxEntries = 1 << 17
	if r := lim.File(bytes.NewReader(b.Bytes()), int64(b.Len())); r.Format != "zip" || r.Verdict != scan.Data {
		t.Fatalf("%s/%s: %s", r.Format, r.Verdict, r.Reason)
	}
}
