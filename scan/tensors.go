package scan

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"sort"
)

// Safetensors and GGUF are data by design: a header that describes tensors and raw bytes. What can go wrong is the
// header lying, and readers trusting it differently; both are checked as the formats' own loaders check them, and a
// lie is malformed. Only the headers are read.

func looksSafetensors(head []byte, size int64) bool {
	if len(head) < 9 || head[8] != '{' {
		return false
	}
	n := binary.LittleEndian.Uint64(head)
	return n >= 2 && n <= uint64(size-8)
}

// safetensorsBits is each dtype's width in bits (safetensors' Dtype::bitsize).
var safetensorsBits = map[string]uint64{
	"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
	"BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64, "C64": 64,
	"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

// safetensors checks the header the way safetensors' validate does: every tensor's byte range matches its dtype
// and shape, the ranges tile the data section exactly in offset order (no overlap, no gap, nothing after), and no
// tensor is named twice.
func (s *scanner) safetensors(r io.ReaderAt, size int64) Report {
	bad := func(format string, a ...any) Report { return malformedReport("safetensors", fmt.Sprintf(format, a...)) }
	h := make([]byte, 8)
	if _, err := r.ReadAt(h, 0); err != nil {
		return bad("header length unreadable")
	}
	n := int64(binary.LittleEndian.Uint64(h))
	if n > s.lim.MaxHeader {
		return bad("header of %d bytes, over the limit of %d", n, s.lim.MaxHeader)
	}
	dataLen := uint64(size - 8 - n)
	dec := json.NewDecoder(bufio.NewReader(io.NewSectionReader(r, 8, n)))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return bad("header is not a JSON object")
	}
	type info struct {
		Dtype   string    `json:"dtype"`
		Shape   *[]uint64 `json:"shape"`
		Offsets *[]uint64 `json:"data_offsets"`
	}
	type span struct {
		name       string
		begin, end uint64
	}
	var spans []span
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return bad("header: %v", err)
		}
		name, _ := t.(string)
		if seen[name] {
			return bad("%q appears twice in the header: JSON readers keep different ones", name)
		}
		seen[name] = true
		if name == "__metadata__" {
			var md map[string]string
			if err := dec.Decode(&md); err != nil {
				return bad("__metadata__: %v", err)
			}
			continue
		}
		if len(spans) >= s.lim.MaxEntries {
			return bad("over %d tensors", s.lim.MaxEntries)
		}
		var ti info
		if err := dec.Decode(&ti); err != nil {
			return bad("tensor %q: %v", name, err)
		}
		w, ok := safetensorsBits[ti.Dtype]
		switch {
		case !ok:
			return bad("tensor %q: unknown dtype %q", name, ti.Dtype)
		case ti.Shape == nil || ti.Offsets == nil || len(*ti.Offsets) != 2:
			return bad("tensor %q: needs shape and data_offsets [begin, end]", name)
		}
		elems := uint64(1)
		for _, d := range *ti.Shape {
			hi, lo := bits.Mul64(elems, d)
			if hi != 0 {
				return bad("tensor %q: shape overflows", name)
			}
			elems = lo
		}
		hi, nbits := bits.Mul64(elems, w)
		if hi != 0 || nbits%8 != 0 {
			return bad("tensor %q: %d elements of %d bits is not a whole number of bytes", name, elems, w)
		}
		b, e := (*ti.Offsets)[0], (*ti.Offsets)[1]
		if e < b || e-b != nbits/8 {
			return bad("tensor %q: data_offsets [%d, %d] hold %d bytes, its dtype and shape need %d", name, b, e, e-b, nbits/8)
		}
		spans = append(spans, span{name, b, e})
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return bad("header is not one JSON object")
	}
	// Only padding may follow the object inside the declared header length.
	if rest, err := io.ReadAll(dec.Buffered()); err != nil || len(bytes.TrimRight(rest, " \t\r\n")) > 0 {
		return bad("bytes after the header's JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return bad("bytes after the header's JSON object")
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].begin < spans[j].begin })
	at := uint64(0)
	for _, sp := range spans {
		switch {
		case sp.begin < at:
			return bad("tensor %q overlaps the tensor before it", sp.name)
		case sp.begin > at:
			return bad("%d bytes unaccounted for before tensor %q", sp.begin-at, sp.name)
		}
		at = sp.end
	}
	if at != dataLen {
		return bad("tensors cover %d bytes of a %d-byte data section", at, dataLen)
	}
	return Report{Format: "safetensors", Verdict: Data}
}

// ggmlTypes is each tensor type's (block size, bytes per block) from ggml's type traits; ids not listed were
// removed from ggml and llama.cpp refuses them too.
var ggmlTypes = map[uint32][2]uint64{
	0: {1, 4}, 1: {1, 2}, 2: {32, 18}, 3: {32, 20}, 6: {32, 22}, 7: {32, 24}, 8: {32, 34}, 9: {32, 36},
	10: {256, 84}, 11: {256, 110}, 12: {256, 144}, 13: {256, 176}, 14: {256, 210}, 15: {256, 292},
	16: {256, 66}, 17: {256, 74}, 18: {256, 98}, 19: {256, 50}, 20: {32, 18}, 21: {256, 110}, 22: {256, 82},
	23: {256, 136}, 24: {1, 1}, 25: {1, 2}, 26: {1, 4}, 27: {1, 8}, 28: {1, 8}, 29: {256, 56}, 30: {1, 2},
	34: {256, 54}, 35: {256, 66}, 39: {32, 17},
}

// gguf reads the header and tensor infos as llama.cpp's gguf_init does: version 2 or 3, at most 4 dimensions, a
// known type, rows a whole number of blocks, and every tensor at exactly the offset the ones before it take up
// (aligned), inside the file. A size or offset that overflows is malformed.
func (s *scanner) gguf(r io.ReaderAt, size int64) Report {
	g := &ggufReader{r: bufio.NewReaderSize(io.NewSectionReader(r, 0, size), 64<<10), size: size}
	bad := func(format string, a ...any) Report { return malformedReport("gguf", fmt.Sprintf(format, a...)) }
	g.skip(4)
	version := g.u32()
	if g.err == nil && version != 2 && version != 3 {
		return bad("version %d (2 and 3 are read)", version)
	}
	nt, nkv := g.u64(), g.u64()
	if g.err != nil {
		return bad("header truncated")
	}
	if nt > uint64(s.lim.MaxEntries) || nkv > uint64(s.lim.MaxEntries) {
		return bad("%d tensors and %d metadata keys: over the limit of %d", nt, nkv, s.lim.MaxEntries)
	}
	align := uint64(32)
	for i := uint64(0); i < nkv && g.err == nil; i++ {
		key := g.str(1 << 16)
		typ := g.u32()
		if key == "general.alignment" && typ == 4 {
			align = uint64(g.u32())
			if align == 0 || align&(align-1) != 0 {
				return bad("general.alignment %d is not a power of two", align)
			}
			continue
		}
		g.value(typ, 0)
	}
	type tinfo struct {
		name        string
		off, nbytes uint64
	}
	infos := make([]tinfo, 0, min(nt, 4096))
	for i := uint64(0); i < nt && g.err == nil; i++ {
		name := g.str(1 << 16)
		nd := g.u32()
		if nd > 4 {
			return bad("tensor %q: %d dimensions (at most 4)", name, nd)
		}
		elems, d0 := uint64(1), uint64(1)
		for j := uint32(0); j < nd; j++ {
			d := g.u64()
			if int64(d) < 0 {
				return bad("tensor %q: negative dimension", name)
			}
			if j == 0 {
				d0 = d
			}
			hi, lo := bits.Mul64(elems, d)
			if hi != 0 || lo > 1<<62 {
				return bad("tensor %q: element count overflows", name)
			}
			elems = lo
		}
		typ, off := g.u32(), g.u64()
		if g.err != nil {
			break
		}
		tt, ok := ggmlTypes[typ]
		if !ok {
			return bad("tensor %q: unknown ggml type %d", name, typ)
		}
		if d0%tt[0] != 0 {
			return bad("tensor %q: row of %d elements is not a whole number of %d-element blocks", name, d0, tt[0])
		}
		hi, nb := bits.Mul64(elems/tt[0], tt[1])
		if hi != 0 {
			return bad("tensor %q: byte size overflows", name)
		}
		infos = append(infos, tinfo{name, off, nb})
	}
	if g.err != nil {
		return bad("header: %v", g.err)
	}
	dataStart := (uint64(g.off) + align - 1) / align * align
	if dataStart > uint64(size) {
		return bad("data section starts past the end of the file")
	}
	dataLen := uint64(size) - dataStart
	at := uint64(0)
	for _, t := range infos {
		if t.off != at {
			return bad("tensor %q at offset %d, where the tensors before it end at %d", t.name, t.off, at)
		}
		end := t.off + t.nbytes
		if end < t.off || end > dataLen {
			return bad("tensor %q: offset %d + %d bytes runs past the %d-byte data section", t.name, t.off, t.nbytes, dataLen)
		}
		at = (end + align - 1) / align * align
	}
	return Report{Format: "gguf", Verdict: Data}
}

type ggufReader struct {
	r    *bufio.Reader
	off  int64
	size int64
	err  error
	buf  [8]byte
}

func (g *ggufReader) read(n int) []byte {
	if g.err != nil {
		return g.buf[:n]
	}
	if _, err := io.ReadFull(g.r, g.buf[:n]); err != nil {
		g.err = errors.New("truncated")
	}
	g.off += int64(n)
	return g.buf[:n]
}

func (g *ggufReader) skip(n uint64) {
	if g.err != nil {
		return
	}
	if n > uint64(g.size-g.off) {
		g.err = fmt.Errorf("a %d-byte value runs past the end of the file", n)
		return
	}
	d, err := g.r.Discard(int(n))
	g.off += int64(d)
	if err != nil {
		g.err = errors.New("truncated")
	}
}

func (g *ggufReader) u32() uint32 { return binary.LittleEndian.Uint32(g.read(4)) }
func (g *ggufReader) u64() uint64 { return binary.LittleEndian.Uint64(g.read(8)) }

func (g *ggufReader) str(keep int) string {
	n := g.u64()
	if g.err != nil {
		return ""
	}
	if n > uint64(keep) {
		g.skip(n)
		return ""
	}
	if n > uint64(g.size-g.off) {
		g.err = errors.New("string runs past the end of the file")
		return ""
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(g.r, b); err != nil {
		g.err = errors.New("truncated")
	}
	g.off += int64(n)
	return string(b)
}

var ggufScalar = map[uint32]uint64{0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

func (g *ggufReader) value(typ uint32, depth int) {
	if w, ok := ggufScalar[typ]; ok {
		g.skip(w)
		return
	}
	switch typ {
	case 8:
		g.str(0)
	case 9:
		if depth > 4 {
			g.err = errors.New("arrays nested deeper than 4")
			return
		}
		et, n := g.u32(), g.u64()
		if w, ok := ggufScalar[et]; ok {
			hi, lo := bits.Mul64(n, w)
			if hi != 0 {
				g.err = errors.New("array size overflows")
				return
			}
			g.skip(lo)
			return
		}
		for i := uint64(0); i < n && g.err == nil; i++ {
			g.value(et, depth+1)
		}
	default:
		if g.err == nil {
			g.err = fmt.Errorf("unknown metadata value type %d", typ)
		}
	}
}
