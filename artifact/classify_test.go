package artifact

import "testing"

func TestKindOf(t *testing.T) {
	cases := map[string]Kind{
		"model-00001-of-00004.safetensors": KindWeight,
		"sub/dir/ggml-model-q4_k_m.gguf":   KindWeight,
		"pytorch_model.bin":                KindWeight,
		"config.json":                      KindWeightConfig,
		"tokenizer.json":                   KindWeightConfig,
		"merges.txt":                       KindWeightConfig,
		"vocab.txt":                        KindWeightConfig,
		"tokenizer.model":                  KindWeightConfig,
		"README.md":                        KindDoc,
		"LICENSE":                          KindDoc,
		"LICENSE.txt":                      KindDoc,
		"docs/usage.rst":                   KindDoc,
		"modeling_llama.py":                KindCode,
		"requirements.txt":                 KindCode,
		"data/train.parquet":               KindDataset,
	}
	for p, want := range cases {
		if got := KindOf(p); got != want {
			t.Errorf("KindOf(%q) = %q, want %q", p, got, want)
		}
	}
}
