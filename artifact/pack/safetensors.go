package pack

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
)

// weightInfo is what a weight file's own header says about the model.
type weightInfo struct {
	format       string            // config.format: safetensors, gguf, …
	params       uint64            // exact parameter count
	byPrecision  map[string]uint64 // parameters per precision name (bfloat16, float32, …)
	family       string            // GGUF general.architecture
	name         string            // GGUF general.name
	quantization string            // GGUF file type (Q4_K_M, …)
}

func (w *weightInfo) add(precision string, n uint64) error {
	sum, carry := bits.Add64(w.params, n, 0)
	if carry != 0 {
		return errors.New("parameter count overflows")
	}
	w.params = sum
	if w.byPrecision == nil {
		w.byPrecision = map[string]uint64{}
	}
	w.byPrecision[precision] += n
	return nil
}

// maxSafetensorsHeader is the header size the reference implementation refuses beyond (100 MB).
const maxSafetensorsHeader = 100 << 20

// safetensorsDtypes maps safetensors dtypes to config precision names.
var safetensorsDtypes = map[string]string{
	"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32", "U32": "uint32",
	"I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
	"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu", "F4": "float4_e2m1fn_x2",
	"F6_E2M3": "float6_e2m3fn", "F6_E3M2": "float6_e3m2fn", "C64": "complex64",
}

// parseSafetensors reads a safetensors header: an 8-byte little-endian length, then that many bytes of JSON mapping
// tensor names to {dtype, shape, data_offsets}, plus an optional "__metadata__" string map. size is the file size,
// used to check that every tensor's data lies inside the file.
func parseSafetensors(r io.Reader, size int64) (*weightInfo, error) {
	var n [8]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, fmt.Errorf("safetensors header: %w", err)
	}
	hlen := binary.LittleEndian.Uint64(n[:])
	if hlen < 2 || hlen > maxSafetensorsHeader || int64(hlen) > size-8 {
		return nil, fmt.Errorf("safetensors header length %d out of range for a %d-byte file", hlen, size)
	}
	buf := make([]byte, hlen)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, fmt.Errorf("safetensors header: %w", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(buf, &raw); err != nil {
		return nil, fmt.Errorf("safetensors header: %w", err)
	}
	dataLen := uint64(size) - 8 - hlen
	info := &weightInfo{format: "safetensors"}
	for name, msg := range raw {
		if name == "__metadata__" {
			var meta map[string]string
			if err := json.Unmarshal(msg, &meta); err != nil {
				return nil, fmt.Errorf("safetensors __metadata__: %w", err)
			}
			continue
		}
		var t struct {
			Dtype       string   `json:"dtype"`
			Shape       []uint64 `json:"shape"`
			DataOffsets []uint64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &t); err != nil {
			return nil, fmt.Errorf("safetensors tensor %q: %w", name, err)
		}
		precision, ok := safetensorsDtypes[t.Dtype]
		if !ok {
			return nil, fmt.Errorf("safetensors tensor %q: unknown dtype %q", name, t.Dtype)
		}
		if len(t.DataOffsets) != 2 || t.DataOffsets[0] > t.DataOffsets[1] || t.DataOffsets[1] > dataLen {
			return nil, fmt.Errorf("safetensors tensor %q: data offsets %v outside the %d data bytes", name, t.DataOffsets, dataLen)
		}
		count, err := product(t.Shape)
		if err != nil {
			return nil, fmt.Errorf("safetensors tensor %q: %w", name, err)
		}
		if err := info.add(precision, count); err != nil {
			return nil, err
		}
	}
	return info, nil
}

// product multiplies tensor dimensions, refusing overflow. A scalar (no dimensions) is one parameter.
func product(dims []uint64) (uint64, error) {
	n := uint64(1)
	for _, d := range dims {
		hi, lo := bits.Mul64(n, d)
		if hi != 0 {
			return 0, fmt.Errorf("shape %v overflows", dims)
		}
		n = lo
	}
	return n, nil
}
