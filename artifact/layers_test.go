package artifact

import (
	"errors"
	"slices"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func desc(mt string, ann map[string]string) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: mt, Digest: digest.FromString(mt + ann[AnnotationTitle]), Size: 1, Annotations: ann}
}

func TestLayersClassifiesEveryFormat(t *testing.T) {
	m := ocispec.Manifest{Layers: []ocispec.Descriptor{
		desc("application/vnd.cncf.model.weight.v1.raw", map[string]string{AnnotationFilepath: "w.safetensors"}),
		desc("application/vnd.cnai.model.doc.v1.tar", map[string]string{LegacyAnnotationFilepath: "docs"}),
		desc("application/vnd.kitops.modelkit.model.v1.tar+gzip", map[string]string{AnnotationFilepath: "model"}),
		desc("application/vnd.kitops.modelkit.code.v1.raw", map[string]string{AnnotationTitle: "run.py"}),
		desc("application/vnd.docker.ai.gguf.v3", nil),
		desc("application/vnd.docker.ai.license", map[string]string{AnnotationFilepath: "LICENSE"}),
		desc("application/octet-stream", map[string]string{AnnotationTitle: "tokenizer.json"}),
		desc("application/vnd.oci.image.layer.v1.tar+zstd", nil),
		desc("application/vnd.docker.image.rootfs.diff.tar.gzip", nil),
	}}
	got, err := Layers(m)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		path   string
		kind   Kind
		format Format
		image  bool
	}{
		{"w.safetensors", KindWeight, FormatRaw, false},
		{"docs", KindDoc, FormatTar, false},
		{"model", KindWeight, FormatTarGzip, false},
		{"run.py", KindCode, FormatRaw, false},
		{"", KindWeight, FormatRaw, false}, // path derived below
		{"LICENSE", KindDoc, FormatRaw, false},
		{"tokenizer.json", KindWeightConfig, FormatRaw, false},
		{"", "", FormatTarZstd, true},
		{"", "", FormatTarGzip, true},
	}
	for i, w := range want {
		l := got[i]
		if i == 4 {
			if !strings.HasSuffix(l.Path, ".gguf") {
				t.Errorf("docker gguf layer path %q, want a .gguf name", l.Path)
			}
		} else if l.Path != w.path {
			t.Errorf("layer %d path %q, want %q", i, l.Path, w.path)
		}
		if l.Kind != w.kind || l.Format != w.format || l.Image != w.image {
			t.Errorf("layer %d = %s/%s image=%v, want %s/%s image=%v", i, l.Kind, l.Format, l.Image, w.kind, w.format, w.image)
		}
	}
}

func TestLayersRefusesUnknownAndEscaping(t *testing.T) {
	for name, d := range map[string]ocispec.Descriptor{
		"unknown media type": desc("application/x-mystery", nil),
		"absolute path":      desc("application/vnd.cncf.model.weight.v1.raw", map[string]string{AnnotationFilepath: "/etc/passwd"}),
		"dot-dot path":       desc("application/vnd.cncf.model.weight.v1.raw", map[string]string{AnnotationFilepath: "a/../../x"}),
		"raw without name":   desc("application/vnd.cncf.model.weight.v1.raw", nil),
		"bad kitops type":    desc("application/vnd.kitops.modelkit.weird.v1.tar", map[string]string{AnnotationFilepath: "x"}),
	} {
		_, err := Layers(ocispec.Manifest{Layers: []ocispec.Descriptor{d}})
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if name == "unknown media type" && !strings.Contains(err.Error(), "application/x-mystery") {
			t.Errorf("%s: error %q does not name the media type", name, err)
		}
	}
}

func TestParseLayerMediaTypeRoundTrip(t *testing.T) {
	for _, k := range Kinds {
		for _, f := range Formats {
			gk, gf, ok := ParseLayerMediaType(LayerMediaType(k, f))
			if !ok || gk != k || gf != f {
				t.Errorf("round trip of %s/%s gave %s/%s ok=%v", k, f, gk, gf, ok)
			}
			legacy := strings.Replace(LayerMediaType(k, f), "vnd.cncf.", "vnd.cnai.", 1)
			if gk, gf, ok := ParseLayerMediaType(legacy); !ok || gk != k || gf != f {
				t.Errorf("legacy %s not accepted", legacy)
			}
		}
	}
	if _, _, ok := ParseLayerMediaType("application/vnd.cncf.model.weights.v1.raw"); ok {
		t.Error("accepted an unknown kind")
	}
}

func FuzzLayers(f *testing.F) {
	f.Add("application/vnd.cncf.model.weight.v1.raw", "w.safetensors")
	f.Add("application/vnd.kitops.modelkit.modelpart.v1.tar", "../x")
	f.Add("application/vnd.docker.ai.safetensors", "")
	f.Fuzz(func(t *testing.T, mt, p string) {
		ls, err := Layers(ocispec.Manifest{Layers: []ocispec.Descriptor{desc(mt, map[string]string{AnnotationFilepath: p})}})
		if err != nil {
			return
		}
		// Whatever is accepted must stay inside the model root.
		if l := ls[0]; !l.Image && checkModelPath(l.Path) != nil {
			t.Fatalf("accepted escaping path %q", l.Path)
		}
	})
}

// Two layers at one path, or a file that another layer needs as a directory, are refused with both layers named:
// which one would win depends on extraction order.
func TestLayersRefusesConflictingPaths(t *testing.T) {
	raw := func(p, content string) ocispec.Descriptor {
		return ocispec.Descriptor{MediaType: "application/vnd.cncf.model.weight.v1.raw", Digest: digest.FromString(content), Size: 1,
			Annotations: map[string]string{AnnotationFilepath: p}}
	}
	dir := func(p, content string) ocispec.Descriptor {
		return ocispec.Descriptor{MediaType: "application/vnd.cncf.model.code.v1.tar", Digest: digest.FromString(content), Size: 1,
			Annotations: map[string]string{AnnotationFilepath: p}}
	}
	for name, tc := range map[string]struct {
		layers []ocispec.Descriptor
		a, b   string // the digests the error must name
	}{
		"same file twice":          {[]ocispec.Descriptor{raw("w.bin", "1"), raw("other", "x"), raw("./w.bin", "2")}, "1", "2"},
		"file then file below it":  {[]ocispec.Descriptor{raw("a", "1"), raw("a/b", "2")}, "1", "2"},
		"file below then the file": {[]ocispec.Descriptor{raw("a/b/c", "1"), raw("a", "2")}, "2", "1"},
		"file and directory layer": {[]ocispec.Descriptor{dir("code", "1"), raw("code", "2")}, "2", "1"},
		"file and directory below": {[]ocispec.Descriptor{raw("code", "1"), dir("code/src", "2")}, "1", "2"},
	} {
		_, err := Layers(ocispec.Manifest{Layers: tc.layers})
		if !errors.Is(err, ErrPathConflict) {
			t.Errorf("%s: got %v, want ErrPathConflict", name, err)
			continue
		}
		for _, c := range []string{tc.a, tc.b} {
			if !strings.Contains(err.Error(), digest.FromString(c).String()) {
				t.Errorf("%s: %q does not name layer %s", name, err, digest.FromString(c))
			}
		}
	}
	for name, layers := range map[string][]ocispec.Descriptor{
		"one blob listed twice":    {raw("w.bin", "1"), raw("w.bin", "1")},
		"siblings":                 {raw("a/b", "1"), raw("a/c", "2"), dir("a/d", "3")},
		"two tars of one dir":      {dir("src", "1"), dir("src", "2")},
		"prefix that is not a dir": {raw("ab", "1"), raw("a/b", "2")},
	} {
		if _, err := Layers(ocispec.Manifest{Layers: layers}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := Layers(ocispec.Manifest{Layers: []ocispec.Descriptor{raw(".", "1")}}); err == nil {
		t.Error("a raw layer at the model root (path \".\") was accepted")
	}
}

// Item: one kind vocabulary, the spec's (weight, weight.config, doc, code, dataset), with the plural and short
// spellings users type accepted as aliases; an unknown kind's error lists the valid ones.
func TestParseKindAliases(t *testing.T) {
	for in, want := range map[string]Kind{
		"weight": KindWeight, "weights": KindWeight, "Weights": KindWeight, "weight.config": KindWeightConfig,
		"config": KindWeightConfig, "configs": KindWeightConfig, "doc": KindDoc, "docs": KindDoc, "code": KindCode,
		"dataset": KindDataset, "datasets": KindDataset, " doc ": KindDoc,
	} {
		if got, err := ParseKind(in); err != nil || got != want {
			t.Errorf("ParseKind(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	_, err := ParseKind("models")
	if err == nil || !strings.Contains(err.Error(), "valid: weight, weight.config, doc, code, dataset") {
		t.Errorf("ParseKind(models): %v", err)
	}
}

// Whatever ParseKind accepts is one of the spec's kinds, and the spec's names map to themselves.
func FuzzParseKind(f *testing.F) {
	for _, s := range []string{"weight", "weights", "config", "DOCS", "weight.config", " code", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKind(s)
		if err != nil {
			return
		}
		if !slices.Contains(Kinds, k) {
			t.Fatalf("ParseKind(%q) = %q, no spec kind", s, k)
		}
		if again, err := ParseKind(string(k)); err != nil || again != k {
			t.Fatalf("ParseKind(%q) = %q, %v", k, again, err)
		}
	})
}
