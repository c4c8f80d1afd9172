package pack

import (
	"fmt"
	"strings"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/artifact"
)

// Summary is how Pack classified a model's files, known before any blob is written: what `pack` prints once, and
// all that `pack --dry-run` does.
type Summary struct {
	// Kinds has, per kind in spec order, the files packed as that kind and their bytes; kinds with no file are
	// left out.
	Kinds []KindTotal `json:"kinds"`
	// Unknown are the files whose names say nothing of their kind, packed as the kind of their layer
	// (weight.config for a raw one) because no rule names them.
	Unknown []UnknownFile `json:"unknown,omitempty"`
	// Layers are the layers Pack writes, in manifest order (the config blob is not listed).
	Layers []PlannedLayer `json:"layers"`
}

// KindTotal is the files of one kind.
type KindTotal struct {
	Kind  artifact.Kind `json:"kind"`
	Files int           `json:"files"`
	Bytes int64         `json:"bytes"`
}

// UnknownFile is a file of unknown kind and the kind it is packed as.
type UnknownFile struct {
	Path string        `json:"path"`
	Kind artifact.Kind `json:"kind"`
}

// PlannedLayer is one layer Pack writes.
type PlannedLayer struct {
	Path      string        `json:"path"` // org.cncf.model.filepath: the file, or the directory an archive holds
	Kind      artifact.Kind `json:"kind"`
	MediaType string        `json:"mediaType"`
	Files     int           `json:"files"`
	// Bytes is the file content the layer holds: a raw layer's size; an archive adds headers or compresses.
	Bytes int64 `json:"bytes"`
	// Digest is set when it is known without reading the file: a Hub file's LFS sha256.
	Digest digest.Digest `json:"digest,omitempty"`
}

// summarize counts the files of each kind and lists those of unknown kind.
func summarize(layers []layerPlan) *Summary {
	s := &Summary{}
	files, bytes := map[artifact.Kind]int{}, map[artifact.Kind]int64{}
	for _, l := range layers {
		pl := PlannedLayer{Path: l.path, Kind: l.kind, MediaType: artifact.LayerMediaType(l.kind, l.format), Bytes: l.size}
		for _, n := range l.nodes {
			if n.dir {
				continue
			}
			pl.Files++
			if _, known := artifact.Classify(n.rel); !known && !l.ruled {
				s.Unknown = append(s.Unknown, UnknownFile{Path: n.rel, Kind: l.kind})
			}
		}
		if r := l.nodes[0].remote; r != nil && l.format == artifact.FormatRaw {
			pl.Digest = r.Digest
		}
		files[l.kind] += pl.Files
		bytes[l.kind] += l.size
		s.Layers = append(s.Layers, pl)
	}
	for _, k := range artifact.Kinds {
		if files[k] > 0 {
			s.Kinds = append(s.Kinds, KindTotal{Kind: k, Files: files[k], Bytes: bytes[k]})
		}
	}
	return s
}

// unknownWarning is what a pack that packs files of unknown kind says, so that none is packed silently.
func unknownWarning(unknown []UnknownFile) string {
	byKind := map[artifact.Kind][]string{}
	var order []artifact.Kind
	for _, u := range unknown {
		if byKind[u.Kind] == nil {
			order = append(order, u.Kind)
		}
		byKind[u.Kind] = append(byKind[u.Kind], u.Path)
	}
	var parts []string
	for _, k := range order {
		parts = append(parts, fmt.Sprintf("%s packed as %s", listPaths(byKind[k]), k))
	}
	return fmt.Sprintf("unknown kind: %s; use --kind PATTERN=KIND (%s) to say what they are", strings.Join(parts, "; "), artifact.KindNames())
}
