package schema

import (
	"strings"
	"testing"
)

// The schema must accept the spec's example and refuse what the spec forbids, or validating against it proves
// nothing.
func TestSchema(t *testing.T) {
	valid := `{
	  "descriptor": {"createdAt": "2025-01-01T00:00:00Z", "authors": ["a@b.c"], "vendor": "XYZ", "family": "xyz3",
	    "name": "xyz-3-8B", "version": "3.1", "title": "XYZ", "description": "d", "docURL": "https://x.example/doc",
	    "sourceURL": "https://x.example/src", "datasetsURL": ["https://x.example/ds"], "revision": "123", "licenses": ["Apache-2.0"]},
	  "config": {"architecture": "transformer", "format": "safetensors", "paramSize": "8b", "precision": "bfloat16",
	    "quantization": "gptq", "capabilities": {"inputTypes": ["text"], "outputTypes": ["text", "image"],
	    "knowledgeCutoff": "2024-05-21T00:00:00Z", "reasoning": true, "toolUsage": false, "reward": false, "languages": ["en"]}},
	  "modelfs": {"type": "layers", "diffIds": ["sha256:1234567890abcdef1234567890abcdef1234567890abcdef1234567890abcdef"]}
	}`
	if err := ValidateConfig([]byte(valid)); err != nil {
		t.Fatalf("spec example refused: %v", err)
	}
	const fs = `"modelfs": {"type": "layers", "diffIds": ["sha256:1234567890abcdef1234567890abcdef1234567890abcdef1234567890abcdef"]}`
	bad := map[string]string{
		"missing descriptor":     `{"config": {}, ` + fs + `}`,
		"missing config":         `{"descriptor": {}, ` + fs + `}`,
		"missing modelfs":        `{"descriptor": {}, "config": {}}`,
		"extra top-level key":    `{"descriptor": {}, "config": {}, ` + fs + `, "extra": 1}`,
		"extra descriptor key":   `{"descriptor": {"colour": "red"}, "config": {}, ` + fs + `}`,
		"snake_case diff_ids":    `{"descriptor": {}, "config": {}, "modelfs": {"type": "layers", "diff_ids": ["sha256:ab"]}}`,
		"empty diffIds":          `{"descriptor": {}, "config": {}, "modelfs": {"type": "layers", "diffIds": []}}`,
		"modelfs type":           `{"descriptor": {}, "config": {}, "modelfs": {"type": "files", "diffIds": ["sha256:ab"]}}`,
		"paramSize without unit": `{"descriptor": {}, "config": {"paramSize": "8000"}, ` + fs + `}`,
		"paramSize two decimals": `{"descriptor": {}, "config": {"paramSize": "6.74B"}, ` + fs + `}`,
		"createdAt not a date":   `{"descriptor": {"createdAt": "yesterday"}, "config": {}, ` + fs + `}`,
		"unknown modality":       `{"descriptor": {}, "config": {"capabilities": {"inputTypes": ["smell"]}}, ` + fs + `}`,
		"not a digest":           `{"descriptor": {}, "config": {}, "modelfs": {"type": "layers", "diffIds": ["abc"]}}`,
	}
	for name, doc := range bad {
		err := ValidateConfig([]byte(doc))
		if err == nil {
			t.Errorf("%s: accepted %s", name, doc)
		} else if strings.TrimSpace(err.Error()) == "" {
			t.Errorf("%s: empty error", name)
		}
	}
}
