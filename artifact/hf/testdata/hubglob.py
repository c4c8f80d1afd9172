# Writes hubglob.json: for each pattern, the paths huggingface_hub's filter_repo_objects keeps, by running that
# function itself (huggingface_hub src/huggingface_hub/utils/_paths.py, commit given as argv[2]) on Python's fnmatch.
# Usage: python3 hubglob.py PATH/TO/_paths.py COMMIT > hubglob.json
import importlib.util, json, sys

spec = importlib.util.spec_from_file_location("_paths", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)

paths = [
    "config.json", "onnx/config.json", "model.safetensors", "model-00001-of-00002.safetensors",
    "original/consolidated.00.pth", "tokenizer/tokenizer.json", "a/b/c.txt", "README.md", "readme.md",
    "extra/a.txt", "extra/b.txt", "extra/d.txt", "extra/-.txt", "extra/].txt", "extra/!.txt", "extra/[.txt",
    "gguf/model-Q4_K_M.gguf", "gguf/model-Q8_0.gguf", "data.json", "data/sub/file.json", "x", "xy", "é.bin",
]
patterns = [
    "*", "*.json", "config.json", "*/config.json", "onnx/*", "onnx/", "original/", "*.safetensors",
    "model-0000?-of-*.safetensors", "extra/[a-c].txt", "extra/[!a-c].txt", "extra/[c-a].txt", "extra/[!c-a].txt",
    "extra/[]].txt", "extra/[!]].txt", "extra/[-].txt", "extra/[a-].txt", "extra/[!!].txt", "extra/[.txt",
    "extra/[[].txt", "*Q4_K_M*", "gguf/*Q8*", "data*.json", "data/*.json", "**/*.json", "x?", "?", "[xy]*",
    "README.*", "*.MD", "a\\b\\*", "tokenizer\\", "?.bin", "a/*/c.txt", "*/*/*",
]
table = []
for p in patterns:
    table.append({"pattern": p,
                  "allow": list(mod.filter_repo_objects(paths, allow_patterns=[p])),
                  "ignore": list(mod.filter_repo_objects(paths, ignore_patterns=[p]))})
json.dump({"source": "huggingface/huggingface_hub " + sys.argv[2] + " src/huggingface_hub/utils/_paths.py filter_repo_objects, Python " + sys.version.split()[0],
           "paths": paths, "table": table}, sys.stdout, indent=1, ensure_ascii=False)
print()
