package artifact

import (
	"errors"
	"fmt"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/internal/errdef"
)

// ErrAmbiguousIndex: an index with several manifests and no platform on any to choose by.
var ErrAmbiguousIndex = errors.New("index has no platforms to choose by")

// ChoosePlatform picks the manifest of an index for platform want (an arm64 variant "" is "v8"). An index with no
// platforms and one manifest (a model wrapped in an index by its packer) gives that manifest, whatever want is.
// Nested indexes and foreign entries are not candidates. It is the one chooser of `fetch`, the node cache and the
// CSI driver, so they agree on every index. No match wraps errdef.ErrNotFound and lists the platforms present.
func ChoosePlatform(ix ocispec.Index, want ocispec.Platform) (ocispec.Descriptor, error) {
	var unplatformed []ocispec.Descriptor
	var seen []string
	best, bestScore := -1, 0
	for i, m := range ix.Manifests {
		if m.MediaType != "" && !IsManifest(m.MediaType) {
			continue
		}
		pl := m.Platform
		if pl == nil || pl.OS == "" || pl.OS == "unknown" {
			// No platform, or buildx's attestation entries (unknown/unknown).
			if pl == nil || pl.OS == "" {
				unplatformed = append(unplatformed, m)
			}
			continue
		}
		seen = append(seen, PlatformString(*pl))
		if pl.OS != want.OS || pl.Architecture != want.Architecture {
			continue
		}
		score := 1
		if normVariant(pl.Architecture, pl.Variant) == normVariant(want.Architecture, want.Variant) {
			score = 2
		} else if want.Variant != "" && pl.Variant != "" {
			continue
		}
		if score > bestScore {
			best, bestScore = i, score
		}
	}
	switch {
	case best >= 0:
		return ix.Manifests[best], nil
	case len(seen) == 0 && len(unplatformed) == 1:
		return unplatformed[0], nil
	case len(seen) == 0:
		return ocispec.Descriptor{}, fmt.Errorf("%w: %d manifests", ErrAmbiguousIndex, len(unplatformed))
	}
	return ocispec.Descriptor{}, fmt.Errorf("%w: no manifest for platform %s in the index (it has %s)", errdef.ErrNotFound, PlatformString(want), strings.Join(seen, ", "))
}

// ParsePlatform reads "os/arch[/variant]".
func ParsePlatform(s string) (ocispec.Platform, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return ocispec.Platform{}, fmt.Errorf("platform %q: want os/arch[/variant], e.g. linux/amd64", s)
	}
	p := ocispec.Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	}
	return p, nil
}

// PlatformString writes p as os/arch[/variant].
func PlatformString(p ocispec.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

func normVariant(arch, v string) string {
	if arch == "arm64" && v == "" {
		return "v8"
	}
	return v
}
