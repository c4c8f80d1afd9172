package prepull

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

// A list file, as kept in a ConfigMap, is YAML: either a sequence of references or
//
//	models:
//	  - registry.example.com/models/llama3:8b
//	  - ref: registry.example.com/models/qwen2@sha256:…
//
// Unknown keys are errors, so a typo never silently drops a model.
type listFile struct {
	Models []listItem `json:"models"`
}

type listItem struct {
	Ref string `json:"ref"`
}

func (li *listItem) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		return json.Unmarshal(b, &li.Ref)
	}
	type plain listItem
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode((*plain)(li))
}

// ParseList reads a list file's references, in order, without duplicates.
func ParseList(b []byte) ([]string, error) {
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, err
	}
	j = bytes.TrimSpace(j)
	var items []listItem
	switch {
	case len(j) == 0 || string(j) == "null":
	case j[0] == '[':
		err = strictJSON(j, &items)
	default:
		var f listFile
		err = strictJSON(j, &f)
		items = f.Models
	}
	if err != nil {
		return nil, err
	}
	refs := make([]string, 0, len(items))
	seen := map[string]bool{}
	for i, it := range items {
		if err := validRef(it.Ref); err != nil {
			return nil, fmt.Errorf("entry %d: %w", i+1, err)
		}
		if !seen[it.Ref] {
			seen[it.Ref] = true
			refs = append(refs, it.Ref)
		}
	}
	return refs, nil
}

// ReadList reads and parses a list file.
func ReadList(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	refs, err := ParseList(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return refs, nil
}

func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			return fmt.Errorf("unexpected %s at %s", ute.Value, ute.Field)
		}
		return err
	}
	return nil
}
