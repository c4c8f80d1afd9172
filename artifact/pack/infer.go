package pack

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// weightFormats maps weight file extensions to config.format values.
var weightFormats = map[string]string{
	".safetensors": "safetensors", ".gguf": "gguf", ".ggml": "ggml", ".onnx": "onnx", ".onnx_data": "onnx",
	".bin": "pytorch", ".pt": "pytorch", ".pth": "pytorch", ".ckpt": "pytorch", ".mar": "pytorch",
	".h5": "keras", ".hdf5": "keras", ".keras": "keras", ".pb": "tensorflow", ".tflite": "tflite",
	".msgpack": "flax", ".mlmodel": "coreml", ".engine": "tensorrt", ".plan": "tensorrt", ".nemo": "nemo",
	".pdparams": "paddle", ".llamafile": "llamafile", ".npz": "numpy", ".npy": "numpy",
	".joblib": "joblib", ".pkl": "pickle", ".params": "mxnet",
}

// readWeightHeader parses the header of a safetensors or GGUF file. Other formats have nothing to parse (nil, nil).
func readWeightHeader(ctx context.Context, n node) (*weightInfo, error) {
	parse := map[string]func(io.Reader, int64) (*weightInfo, error){
		".safetensors": parseSafetensors,
		".gguf":        func(r io.Reader, _ int64) (*weightInfo, error) { return parseGGUF(r) },
	}[strings.ToLower(path.Ext(n.rel))]
	if parse == nil {
		return nil, nil
	}
	// A remote file's header is read from its source and the stream dropped after it: a few KiB of a weight
	// that is read whole, and checked, only when its layer is written.
	f, err := n.open(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parse(f, n.size)
}

// hfConfig is the part of a Hugging Face config.json that says what the model is.
type hfConfig struct {
	ModelType     string   `json:"model_type"`
	Architectures []string `json:"architectures"`
	TorchDtype    string   `json:"torch_dtype"`
	Dtype         string   `json:"dtype"`
	Quantization  *struct {
		QuantMethod string `json:"quant_method"`
	} `json:"quantization_config"`
	NumAttentionHeads *int `json:"num_attention_heads"`
	NHead             *int `json:"n_head"`
	EncoderLayers     *int `json:"encoder_layers"`
}

// transformerHeads are architecture-class suffixes of Transformers models.
var transformerHeads = []string{"ForCausalLM", "ForConditionalGeneration", "ForSeq2SeqLM", "ForMaskedLM",
	"ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "Model", "LMHeadModel"}

func parseHFConfig(data []byte) (*hfConfig, error) {
	var c hfConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *hfConfig) architecture() string {
	if c.NumAttentionHeads != nil || c.NHead != nil {
		return "transformer"
	}
	for _, a := range c.Architectures {
		for _, h := range transformerHeads {
			if strings.HasSuffix(a, h) && len(a) > len(h) {
				return "transformer"
			}
		}
	}
	return ""
}

func (c *hfConfig) precision() string {
	d := c.TorchDtype
	if d == "" {
		d = c.Dtype
	}
	return strings.TrimPrefix(d, "torch.")
}

// dominant returns the key holding most of the total, "mixed" when none holds 90%, or "" for an empty map.
func dominant(m map[string]uint64) string {
	var total, best uint64
	var bestKey string
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys) // deterministic among equals
	for _, k := range keys {
		total += m[k]
		if m[k] > best {
			best, bestKey = m[k], k
		}
	}
	if total == 0 {
		return ""
	}
	if float64(best) < 0.9*float64(total) {
		return "mixed"
	}
	return bestKey
}

// paramSizeRE is the spec's <count><scale-prefix>: a decimal with at most one digit after the point, then Q/T/B/M/K.
var paramSizeRE = regexp.MustCompile(`^[0-9]+(\.[0-9])?[QqTtBbMmKk]$`)

// FormatParamSize writes an exact parameter count in the spec's form, rounding to one decimal: 6738415616 → "6.7B",
// 8000000000 → "8B". Counts under 50 (which would round to 0.0K) give "".
func FormatParamSize(n uint64) string {
	scales := []struct {
		v float64
		s string
	}{{1e15, "Q"}, {1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "K"}}
	for i, sc := range scales {
		if float64(n) >= sc.v || i == len(scales)-1 {
			x := math.Round(float64(n)/sc.v*10) / 10
			if x >= 1000 && i > 0 { // 999.96M rounds to 1000.0M: say 1B
				sc = scales[i-1]
				x = math.Round(float64(n)/sc.v*10) / 10
			}
			if x == 0 {
				return ""
			}
			return strconv.FormatFloat(x, 'f', -1, 64) + sc.s
		}
	}
	return ""
}

// ParseParamSize accepts the spec's form ("6.7B") or a plain parameter count ("7000000000", as modctl's Modelfile
// allows) and returns the spec's form.
func ParseParamSize(s string) (string, error) {
	if paramSizeRE.MatchString(s) {
		return s, nil
	}
	if n, err := strconv.ParseUint(s, 10, 64); err == nil {
		if out := FormatParamSize(n); out != "" {
			return out, nil
		}
	}
	return "", fmt.Errorf("invalid parameter size %q (want <count><Q|T|B|M|K> such as 6.7B, or a plain count)", s)
}
