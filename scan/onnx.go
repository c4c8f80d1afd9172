package scan

import (
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// ONNX is a protobuf ModelProto. Loading runs no code from the file, but a tensor's external data names a file
// the runtime opens beside the model: a location that is absolute or climbs out (../../etc/passwd) reads whatever
// the node holds into a tensor, so it is malformed. The walk follows the schema down to every TensorProto
// (initializers, sparse initializers, node attributes, subgraphs), skipping raw tensor bytes without reading them.

type pbReader struct {
	r    io.ReaderAt
	size int64
	buf  []byte
	bOff int64
}

func (p *pbReader) byteAt(off int64) (byte, error) {
	if off < p.bOff || off >= p.bOff+int64(len(p.buf)) {
		if p.buf == nil {
			p.buf = make([]byte, max(1, min(p.size, 32<<10)))
		}
		n, err := p.r.ReadAt(p.buf[:cap(p.buf)], off)
		if n == 0 {
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		p.buf, p.bOff = p.buf[:n], off
	}
	return p.buf[off-p.bOff], nil
}

func (p *pbReader) varint(off, end int64) (uint64, int64, error) {
	var v uint64
	for i := 0; i < 10; i++ {
		if off >= end {
			return 0, off, errors.New("truncated varint")
		}
		b, err := p.byteAt(off)
		if err != nil {
			return 0, off, err
		}
		off++
		v |= uint64(b&0x7f) << (7 * i)
		if b < 0x80 {
			return v, off, nil
		}
	}
	return 0, off, errors.New("varint too long")
}

// field is one protobuf field: its number, wire type, varint value or the [start, end) of its bytes.
type field struct {
	num        uint64
	wire       uint64
	val        uint64
	start, end int64
}

// fields walks the fields of the message in [off, end), calling fn for each; malformed wire data is an error.
func (p *pbReader) fields(off, end int64, fn func(field) error) error {
	for off < end {
		tag, next, err := p.varint(off, end)
		if err != nil {
			return err
		}
		f := field{num: tag >> 3, wire: tag & 7}
		if f.num == 0 {
			return errors.New("field number 0")
		}
		off = next
		switch f.wire {
		case 0:
			f.val, off, err = p.varint(off, end)
		case 1:
			off += 8
		case 5:
			off += 4
		case 2:
			var n uint64
			n, off, err = p.varint(off, end)
			if err == nil && n > uint64(end-off) {
				err = errors.New("length past the end of the message")
			}
			f.start, f.end = off, off+int64(n)
			off = f.end
		default:
			return fmt.Errorf("wire type %d", f.wire)
		}
		if err != nil {
			return err
		}
		if off > end {
			return errors.New("field past the end of the message")
		}
		if fn != nil {
			if err := fn(f); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *pbReader) str(f field) (string, error) {
	if f.wire != 2 || f.end-f.start > 4096 {
		return "", errors.New("string field too long or not bytes")
	}
	b := make([]byte, f.end-f.start)
	_, err := p.r.ReadAt(b, f.start)
	return string(b), err
}

func isProtobuf(r io.ReaderAt, size int64) bool {
	p := &pbReader{r: r, size: size}
	n := 0
	err := p.fields(0, size, func(field) error { n++; return nil })
	return err == nil && n > 0
}

// onnx reports ok when r is a ModelProto: an ir_version varint (field 1) and a graph (field 7), all of it
// well-formed protobuf.
func (s *scanner) onnx(r io.ReaderAt, size int64) (Report, bool) {
	p := &pbReader{r: r, size: size}
	if b, err := p.byteAt(0); err != nil || b != 0x08 {
		return Report{}, false
	}
	var graphs []field
	var ir bool
	err := p.fields(0, size, func(f field) error {
		switch {
		case f.num == 1 && f.wire == 0:
			ir = true
		case f.num == 7 && f.wire == 2:
			graphs = append(graphs, f)
		}
		return nil
	})
	if err != nil || !ir || len(graphs) == 0 {
		return Report{}, false
	}
	res := newResult("onnx", s.lim.MaxFindings)
	w := &onnxWalk{p: p, res: res, budget: s.lim.MaxEntries * 8}
	for _, g := range graphs {
		if err := w.graph(g, 0); err != nil {
			res.malformed("ONNX: %v", err)
			break
		}
	}
	return res.report(), true
}

type onnxWalk struct {
	p      *pbReader
	res    *result
	budget int // messages visited
}

func (w *onnxWalk) visit() error {
	if w.budget--; w.budget < 0 {
		return errors.New("more messages than the scan reads")
	}
	return nil
}

// GraphProto: node 1, initializer 5, sparse_initializer 15.
func (w *onnxWalk) graph(g field, depth int) error {
	if depth > 32 {
		return errors.New("subgraphs nested deeper than 32")
	}
	if err := w.visit(); err != nil {
		return err
	}
	return w.p.fields(g.start, g.end, func(f field) error {
		if f.wire != 2 {
			return nil
		}
		switch f.num {
		case 1:
			return w.node(f, depth)
		case 5:
			return w.tensor(f)
		case 15:
			return w.sparse(f)
		}
		return nil
	})
}

// NodeProto: attribute 5. AttributeProto: t 5, g 6, tensors 10, graphs 11, sparse_tensor 22, sparse_tensors 23.
func (w *onnxWalk) node(n field, depth int) error {
	if err := w.visit(); err != nil {
		return err
	}
	return w.p.fields(n.start, n.end, func(f field) error {
		if f.num != 5 || f.wire != 2 {
			return nil
		}
		return w.p.fields(f.start, f.end, func(a field) error {
			if a.wire != 2 {
				return nil
			}
			switch a.num {
			case 5, 10:
				return w.tensor(a)
			case 6, 11:
				return w.graph(a, depth+1)
			case 22, 23:
				return w.sparse(a)
			}
			return nil
		})
	})
}

// SparseTensorProto: values 1, indices 2.
func (w *onnxWalk) sparse(s field) error {
	return w.p.fields(s.start, s.end, func(f field) error {
		if (f.num == 1 || f.num == 2) && f.wire == 2 {
			return w.tensor(f)
		}
		return nil
	})
}

// TensorProto: name 8, external_data 13 (StringStringEntryProto key 1, value 2), data_location 14 (1 = EXTERNAL).
func (w *onnxWalk) tensor(t field) error {
	if err := w.visit(); err != nil {
		return err
	}
	var name, location string
	var external, hasLocation bool
	err := w.p.fields(t.start, t.end, func(f field) error {
		switch {
		case f.num == 8 && f.wire == 2:
			name, _ = w.p.str(f)
		case f.num == 14 && f.wire == 0:
			external = f.val == 1
		case f.num == 13 && f.wire == 2:
			var k, v string
			if err := w.p.fields(f.start, f.end, func(e field) error {
				var err error
				switch e.num {
				case 1:
					k, err = w.p.str(e)
				case 2:
					v, err = w.p.str(e)
				}
				return err
			}); err != nil {
				return err
			}
			if k == "location" {
				location, hasLocation = v, true
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	switch {
	case external && !hasLocation:
		w.res.malformed("tensor %q: external data without a location", name)
	case hasLocation && !insideModel(location):
		w.res.malformed("tensor %q: external data location %q is outside the model directory", name, location)
	}
	return nil
}

// insideModel: a relative path that stays below the model's directory, as onnx.checker requires.
func insideModel(loc string) bool {
	if loc == "" || strings.ContainsAny(loc, "\\\x00:") || strings.HasPrefix(loc, "/") {
		return false
	}
	c := path.Clean(loc)
	return c != ".." && !strings.HasPrefix(c, "../")
}
