package artifact

import (
	"errors"
	"fmt"
	"path"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Layer is a manifest layer with what a reader needs to place it: where it goes, what it holds, how it is encoded.
type Layer struct {
	ocispec.Descriptor
	// Path is the in-model path of a raw file, or the directory a tar layer was made from (informational: tar
	// entries carry their own model-relative paths). Empty for container-image layers.
	Path string
	// Kind is what the layer holds; empty for container-image layers.
	Kind Kind
	// Format is how the bytes are encoded.
	Format Format
	// Image marks a container-image layer: a tar applied at the root with whiteouts.
	Image bool
}

// Other packagings of models met in the wild (KitOps ModelKits, Jozu, Docker Model Runner), read so that their
// artifacts mount too.
const (
	kitopsPrefix       = "application/vnd.kitops.modelkit."
	jozuPrefix         = "application/vnd.jozu.model."
	dockerModelPrefix  = "application/vnd.docker.ai."
	dockerLayerGzip    = "application/vnd.docker.image.rootfs.diff.tar.gzip"
	dockerForeignGzip  = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
	ociLayerPrefix     = "application/vnd.oci.image.layer."
	orasUnpackAnnotate = "io.deis.oras.content.unpack"
)

// Layers classifies every layer of a manifest: ModelPack (current and legacy names), KitOps ModelKits, Docker Model
// Runner artifacts, generic ORAS artifacts and container images. A layer it cannot place is an error naming its
// media type, so nothing is silently dropped from a view.
func Layers(m ocispec.Manifest) ([]Layer, error) {
	out := make([]Layer, 0, len(m.Layers))
	for i, d := range m.Layers {
		l, err := classify(d)
		if err != nil {
			return nil, fmt.Errorf("layer %d (%s): %w", i, d.Digest, err)
		}
		if !l.Image {
			if err := checkModelPath(l.Path); err != nil {
				return nil, fmt.Errorf("layer %d (%s): %w", i, d.Digest, err)
			}
			if l.Format == FormatRaw && path.Clean(l.Path) == "." {
				return nil, fmt.Errorf("layer %d (%s): file path %q names the model root, not a file", i, d.Digest, l.Path)
			}
		}
		out = append(out, l)
	}
	if err := checkPathConflicts(out); err != nil {
		return nil, err
	}
	return out, nil
}

// ErrPathConflict: two layers of one manifest claim the same path, or one claims a file where another puts a
// directory. Which wins would depend on the order of extraction, so the manifest is refused.
var ErrPathConflict = errors.New("conflicting layer paths")

// checkPathConflicts refuses two model layers at one path (unless they are the same blob listed twice), and a
// file that another layer uses as a directory ("a" and "a/b").
func checkPathConflicts(ls []Layer) error {
	conflict := func(i, j int, why string) error {
		return fmt.Errorf("%w: layer %d (%s, path %q) and layer %d (%s, path %q) %s",
			ErrPathConflict, i, ls[i].Digest, ls[i].Path, j, ls[j].Digest, ls[j].Path, why)
	}
	files := map[string]int{}
	for i, l := range ls {
		if l.Image || l.Format != FormatRaw {
			continue
		}
		p := path.Clean(l.Path)
		if j, ok := files[p]; ok {
			if ls[j].Digest != l.Digest {
				return conflict(j, i, "are both that file")
			}
			continue
		}
		files[p] = i
	}
	for i, l := range ls {
		if l.Image || l.Path == "" {
			continue
		}
		p := path.Clean(l.Path)
		if j, ok := files[p]; ok && l.Format != FormatRaw {
			return conflict(j, i, "put a file and a directory at the same path")
		}
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if j, ok := files[d]; ok {
				return conflict(j, i, "need that file to be a directory")
			}
		}
	}
	return nil
}

func classify(d ocispec.Descriptor) (Layer, error) {
	mt := d.MediaType
	l := Layer{Descriptor: d, Path: LayerFilepath(d.Annotations)}
	if k, f, ok := ParseLayerMediaType(mt); ok {
		l.Kind, l.Format = k, f
		return l, requirePath(l)
	}
	switch {
	case strings.HasPrefix(mt, kitopsPrefix), strings.HasPrefix(mt, jozuPrefix):
		return kitops(l, mt)
	case strings.HasPrefix(mt, dockerModelPrefix):
		return dockerModel(l, mt)
	case strings.HasPrefix(mt, ociLayerPrefix), mt == dockerLayerGzip, mt == dockerForeignGzip:
		return image(l, mt)
	}
	// Generic ORAS artifact: any blob named by a title is a file (or, with the unpack annotation, a tar.gz dir).
	if title := d.Annotations[AnnotationTitle]; title != "" {
		l.Path = title
		l.Kind = KindOf(title)
		l.Format = FormatRaw
		if d.Annotations[orasUnpackAnnotate] == "true" {
			l.Format = FormatTarGzip
		}
		return l, nil
	}
	return Layer{}, fmt.Errorf("unsupported layer media type %q: not a ModelPack, KitOps, Docker model, ORAS (titled) or container-image layer", mt)
}

func requirePath(l Layer) error {
	if l.Path == "" && l.Format == FormatRaw {
		return fmt.Errorf("raw layer %q has no %s or %s annotation naming its file", l.MediaType, AnnotationFilepath, AnnotationTitle)
	}
	return nil
}

// kitops maps application/vnd.kitops.modelkit.<type>.v1.<format> (and the older jozu names).
func kitops(l Layer, mt string) (Layer, error) {
	rest := strings.TrimPrefix(strings.TrimPrefix(mt, kitopsPrefix), jozuPrefix)
	typ, format, ok := strings.Cut(rest, ".v1.")
	if !ok {
		// Old jozu names: application/vnd.jozu.model.<type>.tar[+gzip]
		typ, format, ok = strings.Cut(rest, ".")
	}
	if !ok {
		return Layer{}, fmt.Errorf("unsupported KitOps layer media type %q", mt)
	}
	kinds := map[string]Kind{"model": KindWeight, "modelpart": KindWeight, "dataset": KindDataset, "code": KindCode, "docs": KindDoc, "config": KindWeightConfig}
	k, ok := kinds[typ]
	if !ok {
		return Layer{}, fmt.Errorf("unsupported KitOps layer type %q in %q (valid: model, modelpart, dataset, code, docs)", typ, mt)
	}
	f, err := ParseFormat(format)
	if err != nil {
		return Layer{}, fmt.Errorf("KitOps layer %q: %w", mt, err)
	}
	l.Kind, l.Format = k, f
	return l, requirePath(l)
}

// dockerModel maps Docker Model Runner layers: single files (gguf, safetensors, license, …) or a dir tar.
func dockerModel(l Layer, mt string) (Layer, error) {
	sub := strings.TrimPrefix(mt, dockerModelPrefix)
	switch {
	case strings.HasPrefix(sub, "dir.tar"):
		l.Kind, l.Format = KindWeight, FormatTar
		return l, nil
	case strings.HasPrefix(sub, "gguf"), strings.HasPrefix(sub, "safetensors"):
		l.Kind = KindWeight
	case strings.HasPrefix(sub, "license"):
		l.Kind = KindDoc
	case strings.HasPrefix(sub, "vllm.config"), strings.Contains(sub, "config"):
		l.Kind = KindWeightConfig
	default:
		return Layer{}, fmt.Errorf("unsupported Docker model layer media type %q", mt)
	}
	l.Format = FormatRaw
	if l.Path == "" {
		// Older Docker model artifacts name no file: derive a stable one from the digest and type.
		ext := strings.SplitN(sub, ".", 2)[0]
		l.Path = "model-" + l.Digest.Encoded()[:12] + "." + ext
	}
	return l, nil
}

func image(l Layer, mt string) (Layer, error) {
	l.Image, l.Path, l.Kind = true, "", ""
	switch {
	case mt == dockerLayerGzip || mt == dockerForeignGzip || strings.HasSuffix(mt, "tar+gzip"):
		l.Format = FormatTarGzip
	case strings.HasSuffix(mt, "tar+zstd"):
		l.Format = FormatTarZstd
	case strings.HasSuffix(mt, ".tar"):
		l.Format = FormatTar
	default:
		return Layer{}, fmt.Errorf("unsupported image layer media type %q", mt)
	}
	return l, nil
}

// checkModelPath refuses a declared path that would land outside the model root.
func checkModelPath(p string) error {
	if p == "" {
		return nil
	}
	if strings.HasPrefix(p, "/") || strings.Contains(p, "\\") {
		return fmt.Errorf("layer path %q must be relative to the model root", p)
	}
	clean := path.Clean(p)
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return fmt.Errorf("layer path %q escapes the model root", p)
	}
	return nil
}
