package pack

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/artifact"
)

// safetensorsBytes builds a safetensors file with the given tensors (name → dtype, shape) and zeroed data.
func safetensorsBytes(t testing.TB, tensors map[string]any, dataLen int) []byte {
	t.Helper()
	h, err := json.Marshal(tensors)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(h)))
	b.Write(h)
	b.Write(make([]byte, dataLen))
	return b.Bytes()
}

func TestParseSafetensors(t *testing.T) {
	file := safetensorsBytes(t, map[string]any{
		"__metadata__": map[string]string{"format": "pt"},
		"w":            map[string]any{"dtype": "BF16", "shape": []int{4, 8}, "data_offsets": []int{0, 64}},
		"b":            map[string]any{"dtype": "F32", "shape": []int{2}, "data_offsets": []int{64, 72}},
		"scalar":       map[string]any{"dtype": "BF16", "shape": []int{}, "data_offsets": []int{72, 74}},
	}, 74)
	info, err := parseSafetensors(bytes.NewReader(file), int64(len(file)))
	if err != nil {
		t.Fatal(err)
	}
	if info.params != 35 || info.byPrecision["bfloat16"] != 33 || info.byPrecision["float32"] != 2 {
		t.Fatalf("got %d params, %v", info.params, info.byPrecision)
	}
	if p := dominant(info.byPrecision); p != "bfloat16" {
		t.Fatalf("dominant precision %q", p)
	}

	for name, tc := range map[string]struct {
		file []byte
		want string
	}{
		"short":           {[]byte{1, 2, 3}, "header"},
		"huge header":     {append(binary.LittleEndian.AppendUint64(nil, 1<<40), '{', '}'), "out of range"},
		"not json":        {append(binary.LittleEndian.AppendUint64(nil, 2), 'x', 'y'), "header"},
		"unknown dtype":   {safetensorsBytes(t, map[string]any{"w": map[string]any{"dtype": "Q9", "shape": []int{1}, "data_offsets": []int{0, 1}}}, 1), "unknown dtype"},
		"offsets outside": {safetensorsBytes(t, map[string]any{"w": map[string]any{"dtype": "U8", "shape": []int{1}, "data_offsets": []int{0, 100}}}, 1), "outside"},
		"overflow":        {safetensorsBytes(t, map[string]any{"w": map[string]any{"dtype": "U8", "shape": []uint64{1 << 40, 1 << 40}, "data_offsets": []int{0, 1}}}, 1), "overflows"},
	} {
		_, err := parseSafetensors(bytes.NewReader(tc.file), int64(len(tc.file)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", name, err, tc.want)
		}
	}
}

// ggufBuilder writes GGUF v3 files for tests.
type ggufBuilder struct{ b bytes.Buffer }

func (g *ggufBuilder) u32(v uint32) { binary.Write(&g.b, binary.LittleEndian, v) }
func (g *ggufBuilder) u64(v uint64) { binary.Write(&g.b, binary.LittleEndian, v) }
func (g *ggufBuilder) str(s string) { g.u64(uint64(len(s))); g.b.WriteString(s) }

type ggufTensor struct {
	name string
	dims []uint64
	typ  uint32
}

func ggufBytes(arch, name string, fileType uint32, tensors []ggufTensor) []byte {
	g := &ggufBuilder{}
	g.u32(0x46554747)
	g.u32(3)
	g.u64(uint64(len(tensors)))
	g.u64(5)
	g.str("general.architecture")
	g.u32(ggufString)
	g.str(arch)
	g.str("general.name")
	g.u32(ggufString)
	g.str(name)
	g.str("general.file_type")
	g.u32(ggufUint32)
	g.u32(fileType)
	g.str("tokenizer.ggml.tokens") // an array of strings, skipped
	g.u32(ggufArray)
	g.u32(ggufString)
	g.u64(3)
	for _, s := range []string{"a", "bb", "ccc"} {
		g.str(s)
	}
	g.str("llama.rope.scale") // a nested array, skipped
	g.u32(ggufArray)
	g.u32(ggufArray)
	g.u64(1)
	g.u32(ggufFloat32)
	g.u64(2)
	g.u64(0)
	for _, t := range tensors {
		g.str(t.name)
		g.u32(uint32(len(t.dims)))
		for _, d := range t.dims {
			g.u64(d)
		}
		g.u32(t.typ)
		g.u64(0)
	}
	return g.b.Bytes()
}

func TestParseGGUF(t *testing.T) {
	file := ggufBytes("llama", "Tiny Llama", 15, []ggufTensor{
		{"tok_embd", []uint64{64, 100}, 12}, // Q4_K
		{"norm", []uint64{64}, 0},           // F32
	})
	info, err := parseGGUF(bytes.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	if info.params != 6464 || info.family != "llama" || info.name != "Tiny Llama" || info.quantization != "Q4_K_M" {
		t.Fatalf("got %+v", info)
	}
	if info.byPrecision["Q4_K"] != 6400 || info.byPrecision["float32"] != 64 {
		t.Fatalf("precisions %v", info.byPrecision)
	}
	for name, tc := range map[string]struct {
		file []byte
		want string
	}{
		"bad magic":    {[]byte("GGML\x03\x00\x00\x00"), "magic"},
		"version 1":    {[]byte("GGUF\x01\x00\x00\x00"), "version"},
		"truncated":    {file[:40], "truncated"},
		"unknown type": {ggufBytes("x", "y", 1, []ggufTensor{{"t", []uint64{1}, 99}}), "unknown type"},
		"many dims":    {ggufBytes("x", "y", 1, []ggufTensor{{"t", make([]uint64, 9), 0}}), "dimensions"},
	} {
		_, err := parseGGUF(bytes.NewReader(tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", name, err, tc.want)
		}
	}
}

func TestFormatParamSize(t *testing.T) {
	for n, want := range map[uint64]string{
		6738415616: "6.7B", 8000000000: "8B", 8030261248: "8B", 999960000: "1B", 1500: "1.5K", 500: "0.5K",
		20: "", 1_200_000_000_000: "1.2T", 3_000_000_000_000_000: "3Q", 124_439_808: "124.4M",
	} {
		if got := FormatParamSize(n); got != want {
			t.Errorf("FormatParamSize(%d) = %q, want %q", n, got, want)
		}
	}
	for in, want := range map[string]string{"6.7B": "6.7B", "8b": "8b", "7000000000": "7B"} {
		if got, err := ParseParamSize(in); err != nil || got != want {
			t.Errorf("ParseParamSize(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"6.74B", "8G", "", "ten", "12"} {
		if _, err := ParseParamSize(in); err == nil {
			t.Errorf("ParseParamSize(%q) accepted", in)
		}
	}
}

func TestParseModelfile(t *testing.T) {
	mf, err := ParseModelfile(strings.NewReader(`# a comment
NAME gemma-2b
arch transformer
FAMILY gemma
FORMAT safetensors
PARAMSIZE 2506172416
PRECISION bf16
QUANTIZATION awq
CONFIG config.json
MODEL *.safetensors
CODE *.py
DOC *.md
DATASET data/
`), "Modelfile")
	if err != nil {
		t.Fatal(err)
	}
	if mf.Name != "gemma-2b" || mf.Arch != "transformer" || mf.Family != "gemma" || mf.Format != "safetensors" ||
		mf.ParamSize != "2.5B" || mf.Precision != "bf16" || mf.Quantization != "awq" || len(mf.Rules) != 5 {
		t.Fatalf("got %+v", mf)
	}
	if r := mf.Rules[4]; r.Kind != "dataset" || r.Pattern != "data" || r.Source != "Modelfile:13" {
		t.Fatalf("dataset rule %+v", r)
	}
	for _, bad := range []string{"FROM llama3\n", "NAME\n", "MODEL [\n", "PARAMSIZE lots\n", "CODE ../x\n"} {
		if _, err := ParseModelfile(strings.NewReader(bad), "Modelfile"); err == nil || !strings.Contains(err.Error(), "Modelfile:1") {
			t.Errorf("%q: got %v, want an error naming Modelfile:1", bad, err)
		}
	}
}

// The parsers read untrusted files: they must return an error, never panic, loop or allocate without bound.
func FuzzParseWeightHeader(f *testing.F) {
	f.Add(safetensorsBytes(f, map[string]any{"w": map[string]any{"dtype": "BF16", "shape": []int{2, 2}, "data_offsets": []int{0, 8}}}, 8))
	f.Add(ggufBytes("llama", "x", 15, []ggufTensor{{"t", []uint64{4, 4}, 12}}))
	f.Add([]byte("GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff"))
	f.Add([]byte{0xff, 0xff, 0, 0, 0, 0, 0, 0, '{'})
	f.Fuzz(func(t *testing.T, data []byte) {
		if info, err := parseSafetensors(bytes.NewReader(data), int64(len(data))); err == nil {
			checkInfo(t, info)
		}
		if info, err := parseGGUF(bytes.NewReader(data)); err == nil {
			checkInfo(t, info)
		}
		_, _ = parseGGUF(io.MultiReader(bytes.NewReader(data), bytes.NewReader(data)))
	})
}

func checkInfo(t *testing.T, info *weightInfo) {
	var sum uint64
	for _, n := range info.byPrecision {
		sum += n
	}
	if sum != info.params {
		t.Fatalf("per-precision counts %v do not add up to %d", info.byPrecision, info.params)
	}
	_ = FormatParamSize(info.params)
	_ = dominant(info.byPrecision)
}

// memSink keeps blobs in memory; Pack adds layers from several goroutines.
type memSink struct {
	mu    sync.Mutex
	blobs map[string][]byte
}

func (m *memSink) AddBlob(_ context.Context, desc ocispec.Descriptor, open func() (io.ReadCloser, error)) (ocispec.Descriptor, error) {
	rc, err := open()
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	d := digest.FromBytes(b)
	m.mu.Lock()
	m.blobs[d.String()] = b
	m.mu.Unlock()
	desc.Digest, desc.Size = d, int64(len(b))
	return desc, nil
}

func (m *memSink) Commit(_ context.Context, d ocispec.Descriptor, b []byte, _ string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.blobs[d.Digest.String()] = b
	return nil
}

func TestGGUFModelConfig(t *testing.T) {
	dir := t.TempDir()
	file := ggufBytes("qwen2", "Qwen2 Tiny", 7, []ggufTensor{ // Q8_0 file type
		{"tok_embd", []uint64{1000, 1500}, 8}, // Q8_0
		{"output_norm", []uint64{1000}, 0},    // F32
	})
	if err := os.WriteFile(filepath.Join(dir, "qwen2-tiny-q8_0.gguf"), file, 0o644); err != nil {
		t.Fatal(err)
	}
	sink := &memSink{blobs: map[string][]byte{}}
	desc, err := Pack(context.Background(), dir, Options{}, sink)
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	json.Unmarshal(sink.blobs[desc.Digest.String()], &m)
	var cfg artifact.Model
	if err := json.Unmarshal(sink.blobs[m.Config.Digest.String()], &cfg); err != nil {
		t.Fatal(err)
	}
	c := cfg.Config
	if c.Format != "gguf" || c.ParamSize != "1.5M" || c.Quantization != "Q8_0" || c.Precision != "" || c.Architecture != "transformer" ||
		cfg.Descriptor.Family != "qwen2" || cfg.Descriptor.Name != "Qwen2 Tiny" {
		t.Fatalf("config %+v descriptor %+v", c, cfg.Descriptor)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != artifact.LayerMediaType(artifact.KindWeight, artifact.FormatRaw) {
		t.Fatalf("layers %+v", m.Layers)
	}
}

// A weight file whose header cannot be parsed does not stop the pack; it is reported, and no count is guessed.
func TestUnparsableHeaderWarns(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "model.safetensors"), []byte("not a safetensors file"), 0o644)
	var warned []string
	sink := &memSink{blobs: map[string][]byte{}}
	desc, err := Pack(context.Background(), dir, Options{Warn: func(s string) { warned = append(warned, s) }}, sink)
	if err != nil {
		t.Fatal(err)
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "model.safetensors: cannot read safetensors header") {
		t.Fatalf("warnings %q", warned)
	}
	var m ocispec.Manifest
	json.Unmarshal(sink.blobs[desc.Digest.String()], &m)
	if cfg := string(sink.blobs[m.Config.Digest.String()]); strings.Contains(cfg, "paramSize") || !strings.Contains(cfg, `"format":"safetensors"`) {
		t.Fatalf("config %s", cfg)
	}
}
