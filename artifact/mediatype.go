// Package artifact knows the shapes of model artifacts: the CNCF ModelPack media types, annotations and config,
// the formats other tools produce, and how to pack a directory into a ModelPack artifact. It is the one home of
// what every reader of documents asks (document.go): is this an index or a manifest (IsIndex, IsManifest), may it
// be read into memory (CheckSize, ReadDocument, CheckDocument).
package artifact

import (
	"fmt"
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

// ParseKind validates a kind name.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("unknown layer kind %q (valid: weight, weight.config, doc, code, dataset)", s)
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
	k, err := ParseKind(kind)
	if err != nil {
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
