package cache

import (
	"encoding/json"
	"errors"
	"fmt"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/archive"
)

// Manifest media types the cache reads.
const (
	mediaTypeDockerSchema1    = "application/vnd.docker.distribution.manifest.v1+json"
	mediaTypeDockerSchema1Sig = "application/vnd.docker.distribution.manifest.v1+prettyjws"
	dockerImageConfig         = "application/vnd.docker.container.image.v1+json"
)

// maxLayers bounds a manifest's layer list; real images stay under 128 layers and models under a few thousand
// files, so more is a crafted manifest meant to exhaust memory or inodes.
const maxLayers = artifact.MaxEntries

// parsed is a manifest or an index, decoded and validated.
type parsed struct {
	mediaType string
	manifest  *ocispec.Manifest
	index     *ocispec.Index
	layers    []artifact.Layer
	image     bool
}

// parseManifest decodes the bytes of desc, an image/artifact manifest or an index (OCI or Docker v2), and checks
// everything the cache relies on before fetching anything else: known media types, well-formed descriptors, file
// paths that stay inside the model, a layer count that is sane.
func parseManifest(desc ocispec.Descriptor, b []byte) (*parsed, error) {
	var head struct {
		SchemaVersion int             `json:"schemaVersion"`
		MediaType     string          `json:"mediaType"`
		Config        json.RawMessage `json:"config"`
		Manifests     json.RawMessage `json:"manifests"`
	}
	// The shape first: a document nested or listing past the limits is refused before it is decoded.
	if err := artifact.CheckDocument(b); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return nil, fmt.Errorf("manifest %s: %w: %v", desc.Digest, artifact.ErrMalformed, err)
	}
	mt := desc.MediaType
	switch {
	case head.MediaType != "" && mt != "" && head.MediaType != mt:
		return nil, fmt.Errorf("manifest %s: media type %q does not match its descriptor's %q", desc.Digest, head.MediaType, mt)
	case mt == "":
		mt = head.MediaType
	}
	if mt == "" {
		// OCI allows the mediaType field to be absent: tell index from manifest by shape.
		if head.Manifests != nil {
			mt = ocispec.MediaTypeImageIndex
		} else if head.Config != nil {
			mt = ocispec.MediaTypeImageManifest
		}
	}
	switch mt {
	case mediaTypeDockerSchema1, mediaTypeDockerSchema1Sig:
		return nil, fmt.Errorf("manifest %s: %w: Docker schema 1 manifests are deprecated; re-push the image", desc.Digest, ErrUnsupported)
	}
	if head.SchemaVersion != 2 {
		return nil, fmt.Errorf("manifest %s: %w schemaVersion %d", desc.Digest, ErrUnsupported, head.SchemaVersion)
	}
	p := &parsed{mediaType: mt}
	switch {
	case artifact.IsIndex(mt):
		var ix ocispec.Index
		if err := json.Unmarshal(b, &ix); err != nil {
			return nil, fmt.Errorf("index %s: %w", desc.Digest, err)
		}
		if len(ix.Manifests) == 0 {
			return nil, fmt.Errorf("index %s lists no manifests", desc.Digest)
		}
		if len(ix.Manifests) > maxLayers {
			return nil, fmt.Errorf("index %s: %w: %d manifests", desc.Digest, ErrTooLarge, len(ix.Manifests))
		}
		for i, m := range ix.Manifests {
			if err := checkDescriptor(m); err != nil {
				return nil, fmt.Errorf("index %s: manifest %d: %w", desc.Digest, i, err)
			}
		}
		p.index = &ix
	case artifact.IsManifest(mt):
		var m ocispec.Manifest
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
		}
		if err := checkDescriptor(m.Config); err != nil {
			return nil, fmt.Errorf("manifest %s: config: %w", desc.Digest, err)
		}
		if err := artifact.CheckSize("config", m.Config); err != nil {
			return nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
		}
		if len(m.Layers) > maxLayers {
			return nil, fmt.Errorf("manifest %s: %w: %d layers", desc.Digest, ErrTooLarge, len(m.Layers))
		}
		for i, l := range m.Layers {
			if err := checkDescriptor(l); err != nil {
				return nil, fmt.Errorf("manifest %s: layer %d: %w", desc.Digest, i, err)
			}
		}
		layers, err := artifact.Layers(m)
		if err != nil {
			return nil, fmt.Errorf("manifest %s: %w: %w", desc.Digest, ErrUnsupported, err)
		}
		image := false
		for i, l := range layers {
			if l.Image {
				image = true
				continue
			}
			if l.Format == artifact.FormatRaw {
				clean, err := archive.CleanPath(l.Path)
				if err != nil {
					return nil, fmt.Errorf("manifest %s: layer %d (%s): file path: %w", desc.Digest, i, l.Digest, err)
				}
				if clean == "" {
					return nil, fmt.Errorf("manifest %s: layer %d (%s): file path %q names the model root", desc.Digest, i, l.Digest, l.Path)
				}
				layers[i].Path = clean
			}
		}
		if image {
			for i, l := range layers {
				if !l.Image {
					return nil, fmt.Errorf("manifest %s: %w: layer %d (%s) mixes a model layer into a container image", desc.Digest, ErrUnsupported, i, l.MediaType)
				}
			}
		}
		p.manifest, p.layers, p.image = &m, layers, image
	default:
		return nil, fmt.Errorf("manifest %s: %w media type %q (want an OCI or Docker v2 manifest or index)", desc.Digest, ErrUnsupported, mt)
	}
	return p, nil
}

func checkDescriptor(d ocispec.Descriptor) error {
	if err := d.Digest.Validate(); err != nil {
		return fmt.Errorf("%w: invalid digest %q: %w", artifact.ErrMalformed, d.Digest, err)
	}
	if d.Digest.Algorithm() != digest.SHA256 {
		return fmt.Errorf("%w digest algorithm %s (sha256 only)", ErrUnsupported, d.Digest.Algorithm())
	}
	if d.Size < 0 {
		return fmt.Errorf("%w: negative size %d for %s", artifact.ErrMalformed, d.Size, d.Digest)
	}
	return nil
}

// choosePlatform picks the manifest for platform p from an index, with the project's one chooser.
func choosePlatform(ix *ocispec.Index, want ocispec.Platform) (ocispec.Descriptor, error) {
	m, err := artifact.ChoosePlatform(*ix, want)
	if errors.Is(err, artifact.ErrAmbiguousIndex) {
		return m, fmt.Errorf("%w: %w", ErrUnsupported, err)
	}
	return m, err
}
