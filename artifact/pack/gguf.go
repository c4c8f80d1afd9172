package pack

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// GGUF limits. The header of a real model (vocabulary arrays included) is a few MiB; the caps keep a hostile or
// corrupt file from costing more than reading this much of it.
const (
	maxGGUFHeader = 64 << 20
	maxGGUFString = 16 << 20
	maxGGUFDims   = 8
	maxGGUFDepth  = 4 // nested arrays
)

// ggmlTypes names GGML tensor types: floats and integers become precisions, the rest are quantized block formats.
var ggmlTypes = map[uint32]string{
	0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K",
	12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
	20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
	29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}

var ggmlPrecisions = map[string]string{
	"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
	"I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
}

// ggufFileTypes names general.file_type (llama_ftype) values that are quantizations.
var ggufFileTypes = map[uint32]string{
	2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L",
	14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
	22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
	30: "IQ4_XS", 31: "IQ1_M", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}

// GGUF metadata value types.
const (
	ggufUint8 = iota
	ggufInt8
	ggufUint16
	ggufInt16
	ggufUint32
	ggufInt32
	ggufFloat32
	ggufBool
	ggufString
	ggufArray
	ggufUint64
	ggufInt64
	ggufFloat64
)

var ggufScalarSize = map[uint32]int{
	ggufUint8: 1, ggufInt8: 1, ggufBool: 1, ggufUint16: 2, ggufInt16: 2, ggufUint32: 4, ggufInt32: 4,
	ggufFloat32: 4, ggufUint64: 8, ggufInt64: 8, ggufFloat64: 8,
}

type ggufReader struct {
	r   *bufio.Reader
	buf [8]byte
}

// parseGGUF reads a GGUF (v2/v3) header: magic, version, tensor and metadata counts, the metadata key/values and
// the tensor infos (name, dims, type), from which it takes the exact parameter count and the dominant tensor type.
func parseGGUF(r io.Reader) (*weightInfo, error) {
	g := &ggufReader{r: bufio.NewReaderSize(io.LimitReader(r, maxGGUFHeader), 64<<10)}
	magic, err := g.u32()
	if err != nil {
		return nil, err
	}
	if magic != 0x46554747 { // "GGUF" little-endian
		return nil, errors.New("not a GGUF file (bad magic)")
	}
	version, err := g.u32()
	if err != nil {
		return nil, err
	}
	if version < 2 || version > 3 {
		return nil, fmt.Errorf("unsupported GGUF version %d", version)
	}
	tensors, err := g.u64()
	if err != nil {
		return nil, err
	}
	kvs, err := g.u64()
	if err != nil {
		return nil, err
	}
	info := &weightInfo{format: "gguf"}
	for i := uint64(0); i < kvs; i++ {
		key, err := g.str()
		if err != nil {
			return nil, fmt.Errorf("GGUF metadata %d: %w", i, err)
		}
		typ, err := g.u32()
		if err != nil {
			return nil, err
		}
		switch {
		case key == "general.architecture" && typ == ggufString:
			info.family, err = g.str()
		case key == "general.name" && typ == ggufString:
			info.name, err = g.str()
		case key == "general.file_type" && typ == ggufUint32:
			var ft uint32
			ft, err = g.u32()
			info.quantization = ggufFileTypes[ft]
		default:
			err = g.skip(typ, 0)
		}
		if err != nil {
			return nil, fmt.Errorf("GGUF metadata %q: %w", key, err)
		}
	}
	for i := uint64(0); i < tensors; i++ {
		name, err := g.str()
		if err != nil {
			return nil, fmt.Errorf("GGUF tensor %d: %w", i, err)
		}
		ndims, err := g.u32()
		if err != nil {
			return nil, err
		}
		if ndims > maxGGUFDims {
			return nil, fmt.Errorf("GGUF tensor %q: %d dimensions", name, ndims)
		}
		dims := make([]uint64, ndims)
		for d := range dims {
			if dims[d], err = g.u64(); err != nil {
				return nil, err
			}
		}
		typ, err := g.u32()
		if err != nil {
			return nil, err
		}
		if _, err := g.u64(); err != nil { // data offset
			return nil, err
		}
		tname, ok := ggmlTypes[typ]
		if !ok {
			return nil, fmt.Errorf("GGUF tensor %q: unknown type %d", name, typ)
		}
		count, err := product(dims)
		if err != nil {
			return nil, fmt.Errorf("GGUF tensor %q: %w", name, err)
		}
		precision := ggmlPrecisions[tname]
		if precision == "" {
			precision = tname
		}
		if err := info.add(precision, count); err != nil {
			return nil, err
		}
	}
	return info, nil
}

func (g *ggufReader) read(n int) ([]byte, error) {
	if _, err := io.ReadFull(g.r, g.buf[:n]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("GGUF header truncated: %w", err)
	}
	return g.buf[:n], nil
}

func (g *ggufReader) u32() (uint32, error) {
	b, err := g.read(4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (g *ggufReader) u64() (uint64, error) {
	b, err := g.read(8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

func (g *ggufReader) strLen() (int, error) {
	n, err := g.u64()
	if err != nil {
		return 0, err
	}
	if n > maxGGUFString {
		return 0, fmt.Errorf("GGUF string of %d bytes", n)
	}
	return int(n), nil
}

func (g *ggufReader) str() (string, error) {
	n, err := g.strLen()
	if err != nil {
		return "", err
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(g.r, b); err != nil {
		return "", fmt.Errorf("GGUF header truncated: %w", io.ErrUnexpectedEOF)
	}
	return string(b), nil
}

func (g *ggufReader) discard(n int64) error {
	for n > 0 {
		step := min(n, 1<<30)
		if _, err := g.r.Discard(int(step)); err != nil {
			return fmt.Errorf("GGUF header truncated: %w", io.ErrUnexpectedEOF)
		}
		n -= step
	}
	return nil
}

// skip reads past a metadata value of type typ without keeping it.
func (g *ggufReader) skip(typ uint32, depth int) error {
	if size, ok := ggufScalarSize[typ]; ok {
		return g.discard(int64(size))
	}
	switch typ {
	case ggufString:
		n, err := g.strLen()
		if err != nil {
			return err
		}
		return g.discard(int64(n))
	case ggufArray:
		if depth >= maxGGUFDepth {
			return errors.New("GGUF arrays nested too deep")
		}
		elem, err := g.u32()
		if err != nil {
			return err
		}
		n, err := g.u64()
		if err != nil {
			return err
		}
		if size, ok := ggufScalarSize[elem]; ok {
			if n > maxGGUFHeader {
				return fmt.Errorf("GGUF array of %d elements", n)
			}
			return g.discard(int64(n) * int64(size))
		}
		for i := uint64(0); i < n; i++ {
			if err := g.skip(elem, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown GGUF value type %d", typ)
}
