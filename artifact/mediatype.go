// Package artifact knows the shapes of model artifacts: the CNCF ModelPack media types, annotations and config,
// the formats other tools produce, and how to pack a directory into a ModelPack artifact. It is the one home of
// what every reader of documents asks (document.go): is this an index or a manifest (IsIndex, IsManifest), may it
// be read into memory (CheckSize, ReadDocument, CheckDocument).
package artifact

import (
	"fmt"
	"slices"
	"strings"
)

// ModelPack (model-spec v0.0.7+) names.
const (
	ArtifactTypeModelManifest = "application/vnd.cncf.model.manifest.v1+json"
	MediaTypeModelConfig      = "application/vnd.cncf.model.config.v1+json"

	AnnotationFilepath     = "org.cncf.model.filepath"
	AnnotationFileMetadata = "org.cncf.model.file.metadata+json"
	AnnotationUntested     = "org.cncf.model.file.mediatype.untested"
	// AnnotationTitle is how generic OCI tools (oras) name a layer's file.
	AnnotationTitle = "org.opencontainers.image.title"
)

// Legacy names written by model-spec ≤ v0.0.6 and modctl ≤ v0.1.x; accepted on read, never written.
const (
	legacyPrefix                    = "application/vnd.cnai.model."
	LegacyArtifactTypeModelManifest = "application/vnd.cnai.model.manifest.v1+json"
	LegacyMediaTypeModelConfig      = "application/vnd.cnai.model.config.v1+json"
	LegacyAnnotationFilepath        = "org.cnai.model.filepath"
	LegacyAnnotationFileMetadata    = "org.cnai.model.file.metadata+json"
	LegacyAnnotationUntested        = "org.cnai.model.file.mediatype.untested"
)

const modelPrefix = "application/vnd.cncf.model."

// Kind is what a layer holds.
type Kind string

const (
	KindWeight       Kind = "weight"
	KindWeightConfig Kind = "weight.config"
	KindDoc          Kind = "doc"
	KindCode         Kind = "code"
	KindDataset      Kind = "dataset"
)

// Kinds lists every kind in spec order.
var Kinds = []Kind{KindWeight, KindWeightConfig, KindDoc, KindCode, KindDataset}

// Format is how a layer's bytes are laid out.
type Format string

const (
	FormatRaw     Format = "raw"
	FormatTar     Format = "tar"
	FormatTarGzip Format = "tar+gzip"
	FormatTarZstd Format = "tar+zstd"
)

// Formats lists every layer format.
var Formats = []Format{FormatRaw, FormatTar, FormatTarGzip, FormatTarZstd}

// kindAliases are the other spellings users bring (the plural of --filter before v0.1, KitOps' docs, "config"
// for a model's JSON files): accepted wherever a person types a kind, never written and never read from a media
// type, whose names the spec fixes.
var kindAliases = map[string]Kind{
	"weights": KindWeight, "model": KindWeight,
	"config": KindWeightConfig, "configs": KindWeightConfig, "weight-config": KindWeightConfig, "weights.config": KindWeightConfig,
	"docs": KindDoc, "codes": KindCode, "datasets": KindDataset,
}

// ParseKind maps a kind a person typed (--kind, --filter, the filter volume attribute, a Modelfile rule) to the
// spec's name: the spec's own names, an alias, any case.
func ParseKind(s string) (Kind, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if k := Kind(s); slices.Contains(Kinds, k) {
		return k, nil
	}
	if k, ok := kindAliases[s]; ok {
		return k, nil
	}
	return "", fmt.Errorf("unknown kind %q (%s)", s, ValidKinds())
}

// ValidKinds says which kind names ParseKind takes, for errors.
func ValidKinds() string {
	return "valid: " + KindNames() + "; also weights, config, docs, datasets"
}

// KindNames lists the spec's kind names for help and errors.
func KindNames() string {
	names := make([]string, len(Kinds))
	for i, k := range Kinds {
		names[i] = string(k)
	}
	return strings.Join(names, ", ")
}

// ParseFormat validates a layer format name.
func ParseFormat(s string) (Format, error) {
	for _, f := range Formats {
		if string(f) == s {
			return f, nil
		}
	}
	return "", fmt.Errorf("unknown layer format %q (valid: raw, tar, tar+gzip, tar+zstd)", s)
}

// LayerMediaType returns the ModelPack media type for a kind and format.
func LayerMediaType(k Kind, f Format) string {
	return modelPrefix + string(k) + ".v1." + string(f)
}

// ParseLayerMediaType splits a ModelPack layer media type, current or legacy, into kind and format.
func ParseLayerMediaType(mt string) (Kind, Format, bool) {
	var rest string
	switch {
	case strings.HasPrefix(mt, modelPrefix):
		rest = mt[len(modelPrefix):]
	case strings.HasPrefix(mt, legacyPrefix):
		rest = mt[len(legacyPrefix):]
	default:
		return "", "", false
	}
	kind, format, ok := strings.Cut(rest, ".v1.")
	if !ok {
		return "", "", false
	}
	k := Kind(kind) // the spec's names only: an alias is no media type
	if !slices.Contains(Kinds, k) {
		return "", "", false
	}
	f, err := ParseFormat(format)
	if err != nil {
		return "", "", false
	}
	return k, f, true
}

// IsModelManifest reports whether an artifactType or config media type marks a ModelPack artifact.
func IsModelManifest(artifactType, configMediaType string) bool {
	switch artifactType {
	case ArtifactTypeModelManifest, LegacyArtifactTypeModelManifest:
		return true
	}
	switch configMediaType {
	case MediaTypeModelConfig, LegacyMediaTypeModelConfig:
		return true
	}
	return false
}

// LayerFilepath returns the in-model path a layer declares, reading the current, legacy and generic annotations
// in that order of preference.
func LayerFilepath(annotations map[string]string) string {
	for _, k := range []string{AnnotationFilepath, LegacyAnnotationFilepath, AnnotationTitle} {
		if v := annotations[k]; v != "" {
			return v
		}
	}
	return ""
}
