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
	"strconv"
	"strings"
)

// npy reads the header dict numpy.lib.format writes. An object dtype ('O', alone or in a structured dtype) means
// the data is a pickle numpy.load unpickles with allow_pickle=True: code, with the pickle's callables named.
func (s *scanner) npy(r io.ReaderAt, size int64) Report {
	bad := func(format string, a ...any) Report { return malformedReport("npy", fmt.Sprintf(format, a...)) }
	pre := make([]byte, 12)
	if n, _ := r.ReadAt(pre, 0); n < 10 {
		return bad("header truncated")
	}
	var hlen, start int64
	switch pre[6] {
	case 1:
		hlen, start = int64(binary.LittleEndian.Uint16(pre[8:])), 10
	case 2, 3:
		hlen, start = int64(binary.LittleEndian.Uint32(pre[8:])), 12
	default:
		return bad("format version %d", pre[6])
	}
	if hlen > min(s.lim.MaxHeader, 1<<20) || start+hlen > size {
		return bad("header of %d bytes in a %d-byte file", hlen, size)
	}
	h := make([]byte, hlen)
	if _, err := r.ReadAt(h, start); err != nil {
		return bad("header truncated")
	}
	p := &pyLit{s: strings.TrimRight(string(h), " \n\x00")}
	v, err := p.value(0)
	if err == nil && p.i < len(p.s) {
		err = errors.New("text after the header dict")
	}
	d, ok := v.(map[string]any)
	if err != nil || !ok {
		return bad("header is not a dict literal: %v", err)
	}
	descr, shape := d["descr"], d["shape"]
	sh, ok := shape.([]any)
	if descr == nil || !ok {
		return bad("header needs descr and shape")
	}
	dataOff := start + hlen
	if hasObject(descr, 0) {
		res := newResult("npy", s.lim.MaxFindings)
		res.code("numpy.object", "object dtype: numpy.load(allow_pickle=True) unpickles the data")
		rep, _ := s.pickleStream(io.NewSectionReader(r, dataOff, size-dataOff), size-dataOff, 1, true)
		res.merge("", rep)
		return res.report()
	}
	elems := uint64(1)
	for _, x := range sh {
		n, ok := x.(int64)
		if !ok || n < 0 {
			return bad("shape %v", shape)
		}
		hi, lo := bits.Mul64(elems, uint64(n))
		if hi != 0 {
			return bad("shape %v overflows", shape)
		}
		elems = lo
	}
	if item, ok := itemSize(descr); ok {
		hi, need := bits.Mul64(elems, item)
		if hi != 0 || need > uint64(size-dataOff) {
			return bad("shape %v of %d-byte items needs more than the %d bytes after the header", shape, item, size-dataOff)
		}
	}
	return Report{Format: "npy", Verdict: Data}
}

func hasObject(descr any, depth int) bool {
	if depth > 32 {
		return true // a dtype nested this deep is not one numpy writes; do not vouch for it
	}
	switch t := descr.(type) {
	case string:
		return strings.Contains(strings.TrimLeft(t, "<>|="), "O")
	case []any:
		for _, x := range t {
			if hasObject(x, depth+1) {
				return true
			}
		}
	case map[string]any:
		for _, x := range t {
			if hasObject(x, depth+1) {
				return true
			}
		}
	}
	return false
}

// itemSize of a simple dtype string ('<f4', '|b1', '<U10'); structured dtypes are not sized (their size check is
// skipped, their object check is not).
func itemSize(descr any) (uint64, bool) {
	s, ok := descr.(string)
	if !ok {
		return 0, false
	}
	s = strings.TrimLeft(s, "<>|=")
	if s == "" {
		return 0, false
	}
	kind, num := s[0], s[1:]
	if i := strings.IndexByte(num, '['); i >= 0 {
		num = num[:i]
	}
	n, err := strconv.ParseUint(num, 10, 32)
	if err != nil {
		return 0, false
	}
	switch kind {
	case 'b', 'i', 'u', 'f', 'c', 'S', 'a', 'V', 'M', 'm':
		return n, true
	case 'U':
		return 4 * n, true
	}
	return 0, false
}

// pyLit parses the Python literals a .npy header holds: dicts, tuples, lists, strings, ints, True/False/None.
type pyLit struct {
	s string
	i int
}

func (p *pyLit) ws() {
	for p.i < len(p.s) && strings.IndexByte(" \t\n\r", p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *pyLit) value(depth int) (any, error) {
	if depth > 64 {
		return nil, errors.New("nested too deep")
	}
	p.ws()
	if p.i >= len(p.s) {
		return nil, errors.New("unexpected end")
	}
	switch c := p.s[p.i]; {
	case c == '{' || c == '(' || c == '[':
		closer := map[byte]byte{'{': '}', '(': ')', '[': ']'}[c]
		p.i++
		var items []any
		m := map[string]any{}
		for {
			p.ws()
			if p.i < len(p.s) && p.s[p.i] == closer {
				p.i++
				break
			}
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			if c == '{' {
				p.ws()
				if p.i >= len(p.s) || p.s[p.i] != ':' {
					return nil, errors.New("expected ':'")
				}
				p.i++
				x, err := p.value(depth + 1)
				if err != nil {
					return nil, err
				}
				k, _ := v.(string)
				m[k] = x
			} else {
				items = append(items, v)
			}
			p.ws()
			if p.i < len(p.s) && p.s[p.i] == ',' {
				p.i++
			} else if p.i >= len(p.s) || p.s[p.i] != closer {
				return nil, errors.New("expected ',' or a closing bracket")
			}
		}
		if c == '{' {
			return m, nil
		}
		if items == nil {
			items = []any{}
		}
		return items, nil
	case c == '\'' || c == '"':
		j := strings.IndexByte(p.s[p.i+1:], c)
		if j < 0 {
			return nil, errors.New("unterminated string")
		}
		v := p.s[p.i+1 : p.i+1+j]
		p.i += j + 2
		return v, nil
	default:
		j := p.i
		for j < len(p.s) && strings.IndexByte(",:)]} \t\n", p.s[j]) < 0 {
			j++
		}
		tok := p.s[p.i:j]
		p.i = j
		switch tok {
		case "True", "False", "None":
			return tok, nil
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(tok, "L"), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("unexpected %q", tok)
		}
		return n, nil
	}
}

// hdf5 is a bounded byte search, not an HDF5 parser: Keras 2's .h5 stores its model as JSON in the root group's
// model_config attribute, and a Lambda layer there is marshalled Python bytecode load_model runs. The search reads
// the first HDF5Window bytes (where h5py writes root attributes); an attribute stored further in, or compressed,
// is not seen — the "Unsafe formats" section of docs/security.md says so.
func (s *scanner) hdf5(r io.ReaderAt, size int64) Report {
	window := min(size, s.lim.HDF5Window)
	needles := [][]byte{[]byte(`"class_name": "Lambda"`), []byte(`"class_name":"Lambda"`)}
	var sawConfig, sawLambda bool
	buf := make([]byte, 1<<20)
	const overlap = 64
	for off := int64(0); off < window; {
		n, err := r.ReadAt(buf[:min(int64(len(buf)), window-off)], off)
		chunk := buf[:n]
		sawConfig = sawConfig || bytes.Contains(chunk, []byte("model_config"))
		for _, nd := range needles {
			sawLambda = sawLambda || bytes.Contains(chunk, nd)
		}
		if err != nil || n <= overlap {
			break
		}
		off += int64(n - overlap)
	}
	if sawConfig && sawLambda {
		res := newResult("hdf5", s.lim.MaxFindings)
		res.code("keras.layers.Lambda", "Keras HDF5 model_config has a Lambda layer: a Python function load_model runs")
		return res.report()
	}
	return Report{Format: "hdf5", Verdict: Data}
}

// isJSON validates one JSON value token by token (no tree is built); files over 64 MiB are not validated (they
// are text either way, and data).
func isJSON(r io.ReaderAt, size int64) bool {
	if size > 64<<20 {
		return false
	}
	dec := json.NewDecoder(bufio.NewReader(io.NewSectionReader(r, 0, size)))
	b := make([]byte, 1)
	for off := int64(0); off < size; off++ {
		if _, err := r.ReadAt(b, off); err != nil {
			return false
		}
		if strings.IndexByte(" \t\r\n", b[0]) < 0 {
			if b[0] != '{' && b[0] != '[' {
				return false
			}
			break
		}
	}
	depth := 0
	for {
		t, err := dec.Token()
		if err != nil {
			return false
		}
		switch t {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			_, err := dec.Token()
			return errors.Is(err, io.EOF)
		}
	}
}
