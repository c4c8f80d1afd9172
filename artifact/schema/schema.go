// Package schema validates ModelPack config blobs against the spec's JSON schema, for tests: the schema here was
// written from the specification's field list, since the spec's own Go module is not served to this build.
package schema

import (
	"bytes"
	_ "embed"
	"fmt"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

//go:embed config-schema.json
var configSchema []byte

const configSchemaURL = "https://github.com/modelpack/modelpack/artifact/schema/config-schema.json"

var compiled = sync.OnceValues(func() (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(configSchema))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat() // dates and URLs are checked, not just annotated
	if err := c.AddResource(configSchemaURL, doc); err != nil {
		return nil, err
	}
	return c.Compile(configSchemaURL)
})

// ValidateConfig checks a config blob (application/vnd.cncf.model.config.v1+json) against the schema.
func ValidateConfig(config []byte) error {
	sch, err := compiled()
	if err != nil {
		return fmt.Errorf("compile config schema: %w", err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(config))
	if err != nil {
		return fmt.Errorf("config is not JSON: %w", err)
	}
	return sch.Validate(inst)
}
