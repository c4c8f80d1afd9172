package artifact

import (
	"path"
	"strings"
)

// weightExts are file extensions that hold tensors. They get raw, uncompressed layers of their own: weights do not
// compress, and a raw layer can be used in place on the node.
var weightExts = map[string]bool{
	".safetensors": true, ".gguf": true, ".ggml": true, ".bin": true, ".pt": true, ".pth": true, ".onnx": true,
	".onnx_data": true, ".h5": true, ".hdf5": true, ".msgpack": true, ".ckpt": true, ".pb": true, ".tflite": true,
	".keras": true, ".mlmodel": true, ".npz": true, ".npy": true, ".engine": true, ".plan": true, ".nemo": true,
	".llamafile": true, ".mar": true, ".pdparams": true, ".joblib": true, ".pkl": true, ".params": true,
}

var codeExts = map[string]bool{
	".py": true, ".ipynb": true, ".sh": true, ".js": true, ".ts": true, ".go": true, ".rs": true, ".c": true,
	".cc": true, ".cpp": true, ".h": true, ".hpp": true, ".cu": true, ".java": true, ".rb": true, ".jinja": true,
}

// .txt is not here: merges.txt and vocab.txt are tokenizer files. READMEs and licences are matched by name.
var docExts = map[string]bool{".md": true, ".rst": true, ".pdf": true, ".html": true}

var datasetExts = map[string]bool{".parquet": true, ".arrow": true, ".csv": true, ".tsv": true, ".jsonl": true}

// configExts are the configuration a model directory holds: config.json and generation_config.json, tokenizer
// files, vocabularies (vocab.txt, merges.txt, tokenizer.model, *.tiktoken), settings files.
var configExts = map[string]bool{
	".json": true, ".yaml": true, ".yml": true, ".toml": true, ".txt": true, ".model": true, ".tiktoken": true,
	".vocab": true, ".spm": true, ".ini": true, ".cfg": true, ".conf": true, ".proto": true, ".xml": true,
}

// KindOf guesses what a file in a model directory holds from its name. Anything not recognisably weights, code,
// docs or data is treated as configuration (config.json, tokenizer files, vocabularies, templates).
func KindOf(p string) Kind {
	k, _ := Classify(p)
	return k
}

// Classify is KindOf and whether the name told: known is false for a name that is no weight, doc, code, data or
// configuration file KindOf knows (model.dat, a file without an extension), whose kind is the KindWeightConfig
// fallback. pack lists such files rather than pack them silently.
func Classify(p string) (kind Kind, known bool) {
	base := strings.ToLower(path.Base(p))
	ext := path.Ext(base)
	switch {
	case weightExts[ext]:
		return KindWeight, true
	case strings.HasPrefix(base, "readme"), strings.HasPrefix(base, "license"), strings.HasPrefix(base, "licence"),
		strings.HasPrefix(base, "notice"), strings.HasPrefix(base, "copying"), docExts[ext]:
		return KindDoc, true
	case codeExts[ext], base == "requirements.txt":
		return KindCode, true
	case datasetExts[ext]:
		return KindDataset, true
	case configExts[ext], strings.HasPrefix(base, "tokenizer"), strings.HasPrefix(base, "vocab"),
		strings.HasPrefix(base, "merges"), strings.HasPrefix(base, "special_tokens"):
		return KindWeightConfig, true
	}
	return KindWeightConfig, false
}
