package scan

import (
	"bufio"
	"bytes"
	"compress/flate"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"path"
	"sort"
	"strings"
)

// The ZIP reader follows the central directory, as PyTorch's loader (miniz, in caffe2's PyTorchStreamReader) and
// numpy/keras (Python's zipfile) do, and then reads every entry's local header, which is where the bytes a loader
// extracts actually start. Scanners have been bypassed where two readers of one archive disagree (picklescan's
// CVE-2025-10156/10157), so every disagreement is malformed: a local header that differs from its central entry in
// name, method, flags or sizes; duplicate names; entries that overlap or leave unaccounted bytes between them;
// encryption; a method other than stored or deflate; anything before the first entry or after the directory.

type zipEntry struct {
	name         string
	flags        uint16
	method       uint16
	crc          uint32
	csize, usize uint64
	offset       uint64 // local header
	dataOff      uint64 // first byte of the entry's data
	end          uint64 // one past the data (and data descriptor)
}

const (
	sigLocal   = 0x04034b50
	sigCentral = 0x02014b50
	sigEnd     = 0x06054b50
	sigEnd64   = 0x06064b50
	sigLoc64   = 0x07064b50
	sigDesc    = 0x08074b50
)

func hasZipEnd(r io.ReaderAt, size int64) bool {
	_, _, err := findEnd(r, size)
	return err == nil
}

// findEnd locates the end-of-central-directory record that ends exactly at the end of the file (its comment
// reaching EOF): a record with trailing bytes is read differently by different readers.
func findEnd(r io.ReaderAt, size int64) (int64, []byte, error) {
	const endLen = 22
	if size < endLen {
		return 0, nil, errors.New("too small for a ZIP end record")
	}
	n := min(size, endLen+65535)
	buf := make([]byte, n)
	if _, err := r.ReadAt(buf, size-n); err != nil && !errors.Is(err, io.EOF) {
		return 0, nil, err
	}
	for i := len(buf) - endLen; i >= 0; i-- {
		if binary.LittleEndian.Uint32(buf[i:]) != sigEnd {
			continue
		}
		if clen := int(binary.LittleEndian.Uint16(buf[i+20:])); i+endLen+clen == len(buf) {
			return size - n + int64(i), buf[i : i+endLen], nil
		}
	}
	return 0, nil, errors.New("no end-of-central-directory record ending the file")
}

func (s *scanner) zip(r io.ReaderAt, size int64, depth int) Report {
	res := newResult("zip", s.lim.MaxFindings)
	entries, err := s.readZip(r, size)
	if err != nil {
		res.malformed("ZIP: %v", err)
		return res.report()
	}
	// PyTorch archives are <prefix>/data.pkl beside <prefix>/data/<key> storages (raw bytes torch reads as such);
	// TorchScript adds code/ (Python source torch.jit.load compiles and runs) and constants.pkl.
	var torchPrefix string
	names := map[string]bool{}
	allNpy := len(entries) > 0
	for _, e := range entries {
		names[e.name] = true
		if dir, file := path.Split(e.name); file == "data.pkl" && strings.Count(dir, "/") == 1 {
			torchPrefix = dir
		}
		if !strings.HasSuffix(e.name, ".npy") && !strings.HasSuffix(e.name, "/") {
			allNpy = false
		}
	}
	keras := names["config.json"] && (names["metadata.json"] || names["model.weights.h5"])
	switch {
	case torchPrefix != "":
		res.format = "pytorch-zip"
	case keras:
		res.format = "keras"
	case allNpy:
		res.format = "npz"
	}
	for _, e := range entries {
		switch {
		case strings.HasSuffix(e.name, "/") && e.usize == 0:
			continue
		case torchPrefix != "" && strings.HasPrefix(e.name, torchPrefix+"data/"):
			continue // storage bytes
		case torchPrefix != "" && strings.HasPrefix(e.name, torchPrefix+"code/"):
			if !res.hasCallable("torch.jit") {
				res.add(Finding{Member: e.name, Verdict: Code, Callable: "torch.jit", Detail: "TorchScript: code/ holds source torch.jit.load compiles and runs"})
			}
			continue
		}
		if path.Base(e.name) == "constants.pkl" && torchPrefix != "" && !res.hasCallable("torch.jit") {
			res.add(Finding{Member: e.name, Verdict: Code, Callable: "torch.jit", Detail: "TorchScript archive (constants.pkl)"})
		}
		res.merge(e.name, s.zipMember(r, e, depth, keras && e.name == "config.json"))
	}
	return res.report()
}

func (r *result) hasCallable(c string) bool {
	for _, f := range r.findings {
		if f.Callable == c {
			return true
		}
	}
	return false
}

// zipMember scans one entry's bytes: *.pkl as the pickle a loader will unpickle, a Keras config for Lambda layers,
// anything else by its content.
func (s *scanner) zipMember(r io.ReaderAt, e zipEntry, depth int, kerasConfig bool) Report {
	raw := io.NewSectionReader(r, int64(e.dataOff), int64(e.csize))
	open := func() io.Reader {
		if e.method == 8 {
			return flate.NewReader(raw)
		}
		return raw
	}
	check := func(rd io.Reader) io.Reader { return &crcReader{r: rd, want: e.crc, n: e.usize} }
	switch {
	case strings.HasSuffix(e.name, ".pkl"):
		// Loaders read the record whole and check its CRC; so does the scan, past the pickle's STOP.
		cr := &crcReader{r: open(), want: e.crc, n: e.usize}
		rep, _ := s.pickleStream(cr, int64(e.usize), depth+1, true)
		io.Copy(io.Discard, cr)
		if cr.got != cr.n || cr.crc != cr.want {
			res := newResult(rep.Format, s.lim.MaxFindings)
			res.merge("", rep)
			res.malformed("entry has CRC %08x and %d bytes, its headers say %08x and %d", cr.crc, cr.got, cr.want, cr.n)
			return res.report()
		}
		return rep
	case kerasConfig:
		return s.kerasConfig(check(open()), e.usize)
	case e.method == 0:
		return s.file(raw, int64(e.csize), depth+1)
	}
	ra, done, err := s.spool(check(open()), int64(e.usize))
	if err != nil {
		return malformedReport("unknown", "deflated entry: "+err.Error())
	}
	defer done()
	return s.file(ra, int64(e.usize), depth+1)
}

// crcReader fails a read that ends with the wrong CRC-32 or size, as zipfile and miniz do.
type crcReader struct {
	r    io.Reader
	want uint32
	n    uint64
	got  uint64
	crc  uint32
}

func (c *crcReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.crc = crc32.Update(c.crc, crc32.IEEETable, p[:n])
	c.got += uint64(n)
	if c.got > c.n {
		return n, fmt.Errorf("entry holds more than its declared %d bytes", c.n)
	}
	if errors.Is(err, io.EOF) && (c.got != c.n || c.crc != c.want) {
		return n, fmt.Errorf("entry has CRC %08x and %d bytes, its header says %08x and %d", c.crc, c.got, c.want, c.n)
	}
	return n, err
}

// kerasConfig reads a .keras archive's config.json: a Lambda layer carries Python bytecode or source that
// keras.models.load_model runs (Keras 3 only refuses it under safe_mode).
func (s *scanner) kerasConfig(rd io.Reader, size uint64) Report {
	if size > uint64(min(s.lim.MaxHeader, 16<<20)) {
		return malformedReport("json", fmt.Sprintf("Keras config of %d bytes is over the limit", size))
	}
	var cfg any
	if err := json.NewDecoder(rd).Decode(&cfg); err != nil {
		return malformedReport("json", "Keras config: "+err.Error())
	}
	res := newResult("json", s.lim.MaxFindings)
	kerasLambdas(cfg, res, 0)
	return res.report()
}

func kerasLambdas(v any, res *result, depth int) {
	if depth > 256 {
		res.malformed("Keras config nested deeper than 256")
		return
	}
	switch t := v.(type) {
	case map[string]any:
		if c, _ := t["class_name"].(string); (c == "Lambda" || c == "__lambda__") && !res.hasCallable("keras.layers.Lambda") {
			name := "keras.layers.Lambda"
			if cfg, ok := t["config"].(map[string]any); ok {
				if n, ok := cfg["name"].(string); ok {
					name += " " + n
				}
			}
			res.code("keras.layers.Lambda", "Keras "+name+": a Python function load_model runs")
		}
		for _, x := range t {
			kerasLambdas(x, res, depth+1)
		}
	case []any:
		for _, x := range t {
			kerasLambdas(x, res, depth+1)
		}
	}
}

func (s *scanner) readZip(r io.ReaderAt, size int64) ([]zipEntry, error) {
	endOff, end, err := findEnd(r, size)
	if err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	disk, cdDisk := le.Uint16(end[4:]), le.Uint16(end[6:])
	count, total := uint64(le.Uint16(end[8:])), uint64(le.Uint16(end[10:]))
	cdSize, cdOff := uint64(le.Uint32(end[12:])), uint64(le.Uint32(end[16:]))
	cdEnd := uint64(endOff) // where the directory must end: the end record, or the zip64 end record
	if count == 0xffff || total == 0xffff || cdSize == 0xffffffff || cdOff == 0xffffffff {
		loc := make([]byte, 20)
		if endOff < 20 {
			return nil, errors.New("zip64 locator missing")
		}
		if _, err := r.ReadAt(loc, endOff-20); err != nil || le.Uint32(loc) != sigLoc64 {
			return nil, errors.New("zip64 locator missing")
		}
		off64 := le.Uint64(loc[8:])
		e64 := make([]byte, 56)
		if off64 > uint64(endOff) {
			return nil, errors.New("zip64 end record offset past the end record")
		}
		if _, err := r.ReadAt(e64, int64(off64)); err != nil || le.Uint32(e64) != sigEnd64 {
			return nil, errors.New("zip64 end record missing")
		}
		// The record may carry extensible data after its fixed fields; it must still end at the locator.
		if n := le.Uint64(e64[4:]); n < 44 || n > uint64(endOff) || off64+12+n != uint64(endOff-20) {
			return nil, errors.New("zip64 end record not directly before its locator")
		}
		disk, cdDisk = uint16(le.Uint32(e64[16:])), uint16(le.Uint32(e64[20:]))
		count, total = le.Uint64(e64[24:]), le.Uint64(e64[32:])
		cdSize, cdOff = le.Uint64(e64[40:]), le.Uint64(e64[48:])
		cdEnd = off64
	}
	switch {
	case disk != 0 || cdDisk != 0 || count != total:
		return nil, errors.New("multi-disk archive")
	case total > uint64(s.lim.MaxEntries):
		return nil, fmt.Errorf("%d entries, over the limit of %d", total, s.lim.MaxEntries)
	case cdOff > cdEnd || cdEnd-cdOff != cdSize:
		return nil, fmt.Errorf("central directory (%d bytes at %d) does not end where the end record starts (%d)", cdSize, cdOff, cdEnd)
	}
	cd := bufio.NewReaderSize(io.NewSectionReader(r, int64(cdOff), int64(cdSize)), 64<<10)
	entries := make([]zipEntry, 0, min(total, 1024))
	seen := map[string]bool{}
	hdr := make([]byte, 46)
	for i := uint64(0); i < total; i++ {
		if _, err := io.ReadFull(cd, hdr); err != nil || le.Uint32(hdr) != sigCentral {
			return nil, fmt.Errorf("central directory entry %d unreadable", i)
		}
		e := zipEntry{flags: le.Uint16(hdr[8:]), method: le.Uint16(hdr[10:]), crc: le.Uint32(hdr[16:]),
			csize: uint64(le.Uint32(hdr[20:])), usize: uint64(le.Uint32(hdr[24:])), offset: uint64(le.Uint32(hdr[42:]))}
		nameLen, extraLen, commentLen := int(le.Uint16(hdr[28:])), int(le.Uint16(hdr[30:])), int(le.Uint16(hdr[32:]))
		if le.Uint16(hdr[34:]) != 0 {
			return nil, errors.New("multi-disk archive")
		}
		var rest = make([]byte, nameLen+extraLen+commentLen)
		if _, err := io.ReadFull(cd, rest); err != nil {
			return nil, fmt.Errorf("central directory entry %d truncated", i)
		}
		e.name = string(rest[:nameLen])
		if err := zip64Extra(rest[nameLen:nameLen+extraLen], &e.usize, &e.csize, &e.offset); err != nil {
			return nil, fmt.Errorf("%s: %v", e.name, err)
		}
		switch {
		case seen[e.name]:
			return nil, fmt.Errorf("two entries named %q: loaders pick different ones", e.name)
		case e.flags&0x41 != 0:
			return nil, fmt.Errorf("%s: flagged encrypted", e.name)
		case e.method != 0 && e.method != 8:
			return nil, fmt.Errorf("%s: compression method %d (only stored and deflate are read)", e.name, e.method)
		case e.method == 0 && e.csize != e.usize:
			return nil, fmt.Errorf("%s: stored with compressed size %d and size %d", e.name, e.csize, e.usize)
		}
		seen[e.name] = true
		if err := s.checkLocal(r, size, &e); err != nil {
			return nil, fmt.Errorf("%s: %v", e.name, err)
		}
		entries = append(entries, e)
	}
	if _, err := cd.ReadByte(); err == nil {
		return nil, errors.New("bytes after the last central directory entry")
	}
	// Coverage: the entries, in offset order, tile the bytes from 0 to the directory exactly.
	sorted := append([]zipEntry(nil), entries...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].offset < sorted[j].offset })
	at := uint64(0)
	for _, e := range sorted {
		switch {
		case e.offset < at:
			return nil, fmt.Errorf("%s overlaps the entry before it", e.name)
		case e.offset > at:
			return nil, fmt.Errorf("%d unaccounted bytes before %s", e.offset-at, e.name)
		}
		at = e.end
	}
	if at != cdOff {
		return nil, fmt.Errorf("%d unaccounted bytes between the last entry and the central directory", int64(cdOff)-int64(at))
	}
	return entries, nil
}

// zip64Extra replaces the 0xffffffff fields with the zip64 extra field's values, in the order the format fixes.
func zip64Extra(extra []byte, usize, csize, offset *uint64) error {
	le := binary.LittleEndian
	for len(extra) >= 4 {
		id, n := le.Uint16(extra), int(le.Uint16(extra[2:]))
		if 4+n > len(extra) {
			return errors.New("extra field truncated")
		}
		body := extra[4 : 4+n]
		if id == 0x0001 {
			for _, f := range []*uint64{usize, csize, offset} {
				if f == nil || *f != 0xffffffff {
					continue
				}
				if len(body) < 8 {
					return errors.New("zip64 extra field too short")
				}
				*f, body = le.Uint64(body), body[8:]
			}
		}
		extra = extra[4+n:]
	}
	return nil
}

// checkLocal reads the entry's local header and requires it to say what the central directory says.
func (s *scanner) checkLocal(r io.ReaderAt, size int64, e *zipEntry) error {
	le := binary.LittleEndian
	if e.offset > uint64(size) {
		return errors.New("local header offset past the end of the file")
	}
	h := make([]byte, 30)
	if _, err := r.ReadAt(h, int64(e.offset)); err != nil || le.Uint32(h) != sigLocal {
		return errors.New("no local header where the central directory points")
	}
	flags, method := le.Uint16(h[6:]), le.Uint16(h[8:])
	crc, csize, usize := le.Uint32(h[14:]), uint64(le.Uint32(h[18:])), uint64(le.Uint32(h[22:]))
	nameLen, extraLen := int(le.Uint16(h[26:])), int(le.Uint16(h[28:]))
	ne := make([]byte, nameLen+extraLen)
	if _, err := r.ReadAt(ne, int64(e.offset)+30); err != nil {
		return errors.New("local header truncated")
	}
	if name := string(ne[:nameLen]); name != e.name {
		return fmt.Errorf("local header names %q: readers of the local and central headers see different files", name)
	}
	zip64 := false
	if csize == 0xffffffff || usize == 0xffffffff {
		zip64 = true
		if err := zip64Extra(ne[nameLen:], &usize, &csize, nil); err != nil {
			return err
		}
	}
	switch {
	case method != e.method:
		return fmt.Errorf("local header says method %d, central directory %d", method, e.method)
	case flags&0x41 != 0 || flags&0x08 != e.flags&0x08:
		return fmt.Errorf("local header flags %#x differ from the central directory's %#x", flags, e.flags)
	case flags&0x08 == 0 && (crc != e.crc || csize != e.csize || usize != e.usize):
		return fmt.Errorf("local header says %d/%d bytes (CRC %08x), central directory %d/%d (CRC %08x)", csize, usize, crc, e.csize, e.usize, e.crc)
	case flags&0x08 != 0 && (crc != 0 && crc != e.crc || csize != 0 && csize != e.csize || usize != 0 && usize != e.usize):
		return errors.New("local header sizes differ from the central directory's")
	}
	e.dataOff = e.offset + 30 + uint64(nameLen+extraLen)
	e.end = e.dataOff + e.csize
	if e.end < e.dataOff || e.end > uint64(size) {
		return errors.New("data runs past the end of the file")
	}
	if flags&0x08 != 0 { // a data descriptor follows the data: optional signature, CRC, sizes
		d := make([]byte, 24)
		n, _ := r.ReadAt(d, int64(e.end))
		dl := 12
		if zip64 || e.csize >= 0xffffffff || e.usize >= 0xffffffff {
			dl = 20
		}
		if n >= 4 && le.Uint32(d) == sigDesc {
			d, dl = d[4:], dl+4
		}
		if n < dl || le.Uint32(d) != e.crc {
			return errors.New("data descriptor missing or differs from the central directory")
		}
		e.end += uint64(dl)
	}
	return nil
}

// spool makes a decompressed stream readable at random offsets: in memory when small, else in a temporary file
// removed by done. n is the size the container declares; more or fewer bytes are an error.
func (s *scanner) spool(rd io.Reader, n int64) (io.ReaderAt, func(), error) {
	if n > s.lim.MaxSpool {
		return nil, nil, fmt.Errorf("%d decompressed bytes, over the limit of %d", n, s.lim.MaxSpool)
	}
	if n >= 0 && n <= 1<<20 {
		b, err := io.ReadAll(io.LimitReader(rd, n+1))
		if err != nil {
			return nil, nil, err
		}
		if int64(len(b)) != n {
			return nil, nil, fmt.Errorf("%d bytes where %d were declared", len(b), n)
		}
		return bytes.NewReader(b), func() {}, nil
	}
	return s.spoolFile(rd, n)
}
