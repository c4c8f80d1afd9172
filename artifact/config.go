package artifact

import (
	"time"

	digest "github.com/opencontainers/go-digest"
)

// Model is the ModelPack config blob (media type MediaTypeModelConfig).
// Field names and omitempty follow the spec's JSON schema, which forbids additional properties.
type Model struct {
	Descriptor ModelDescriptor `json:"descriptor"`
	ModelFS    ModelFS         `json:"modelfs"`
	Config     ModelConfig     `json:"config"`
}

// ModelDescriptor says what the model is and where it comes from.
type ModelDescriptor struct {
	CreatedAt   *time.Time `json:"createdAt,omitempty"`
	Authors     []string   `json:"authors,omitempty"`
	Vendor      string     `json:"vendor,omitempty"`
	Family      string     `json:"family,omitempty"`
	Name        string     `json:"name,omitempty"`
	Version     string     `json:"version,omitempty"`
	Title       string     `json:"title,omitempty"`
	Description string     `json:"description,omitempty"`
	DocURL      string     `json:"docURL,omitempty"`
	SourceURL   string     `json:"sourceURL,omitempty"`
	DatasetsURL []string   `json:"datasetsURL,omitempty"`
	Revision    string     `json:"revision,omitempty"`
	Licenses    []string   `json:"licenses,omitempty"`
}

// ModelConfig describes the network and how its weights are stored.
type ModelConfig struct {
	Architecture string             `json:"architecture,omitempty"`
	Format       string             `json:"format,omitempty"`
	ParamSize    string             `json:"paramSize,omitempty"`
	Precision    string             `json:"precision,omitempty"`
	Quantization string             `json:"quantization,omitempty"`
	Capabilities *ModelCapabilities `json:"capabilities,omitempty"`
}

// ModelCapabilities are the optional declared capabilities of the model.
type ModelCapabilities struct {
	InputTypes      []string   `json:"inputTypes,omitempty"`
	OutputTypes     []string   `json:"outputTypes,omitempty"`
	KnowledgeCutoff *time.Time `json:"knowledgeCutoff,omitempty"`
	Reasoning       *bool      `json:"reasoning,omitempty"`
	ToolUsage       *bool      `json:"toolUsage,omitempty"`
	Reward          *bool      `json:"reward,omitempty"`
	Languages       []string   `json:"languages,omitempty"`
}

// ModelFS lists the uncompressed digest of every layer, in manifest order.
type ModelFS struct {
	Type    string          `json:"type"`
	DiffIDs []digest.Digest `json:"diffIds"`
}

// FileMetadata is the value of the AnnotationFileMetadata annotation.
type FileMetadata struct {
	Name     string    `json:"name"`
	Mode     uint32    `json:"mode"`
	Uid      uint32    `json:"uid"`
	Gid      uint32    `json:"gid"`
	Size     int64     `json:"size"`
	ModTime  time.Time `json:"mtime"`
	Typeflag byte      `json:"typeflag"`
}
