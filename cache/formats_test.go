package cache

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/artifact"
)

// TestOtherFormats: KitOps ModelKits, Docker Model Runner artifacts, generic ORAS artifacts and legacy (cnai)
// ModelPack names all become the tree their files describe.
func TestOtherFormats(t *testing.T) {
	type layer struct {
		mediaType string
		data      []byte
		ann       map[string]string
	}
	cases := []struct {
		name, artifactType, configType string
		layers                         []layer
		want                           []string
	}{
		{"kitops", "", "application/vnd.kitops.modelkit.config.v1+json", []layer{
			{"application/vnd.kitops.modelkit.model.v1.tar", makeTar(t, false, tarEntry{Name: "model.gguf", Body: "gguf"}), nil},
			{"application/vnd.kitops.modelkit.docs.v1.tar+gzip", makeTar(t, true, tarEntry{Name: "docs/README.md", Body: "# r"}), nil},
		}, []string{"docs dir", "docs/README.md file", "model.gguf file"}},
		{"docker-model", "", "application/vnd.docker.ai.model.config.v0.1+json", []layer{
			{"application/vnd.docker.ai.gguf.v3", []byte("gguf"), map[string]string{artifact.AnnotationFilepath: "model.gguf"}},
			{"application/vnd.docker.ai.license", []byte("MIT"), map[string]string{artifact.AnnotationFilepath: "LICENSE"}},
		}, []string{"LICENSE file", "model.gguf file"}},
		{"oras", "application/vnd.example.thing", "application/vnd.oci.empty.v1+json", []layer{
			{"text/plain", []byte("hello"), map[string]string{artifact.AnnotationTitle: "hello.txt"}},
			{"application/octet-stream", []byte("bin"), map[string]string{artifact.AnnotationTitle: "data/blob.bin"}},
		}, []string{"data dir", "data/blob.bin file", "hello.txt file"}},
		{"legacy-cnai", artifact.LegacyArtifactTypeModelManifest, artifact.LegacyMediaTypeModelConfig, []layer{
			{"application/vnd.cnai.model.weight.v1.raw", []byte("w"), map[string]string{artifact.LegacyAnnotationFilepath: "w.safetensors"}},
			{"application/vnd.cnai.model.doc.v1.tar", makeTar(t, false, tarEntry{Name: "README.md", Body: "r"}), map[string]string{artifact.LegacyAnnotationFilepath: "README.md"}},
		}, []string{"README.md file", "w.safetensors file"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := newMemTarget()
			cfgData := []byte("{}")
			cfg := pushBlob(t, src, tc.configType, cfgData, nil)
			var layers []ocispec.Descriptor
			for _, l := range tc.layers {
				layers = append(layers, pushBlob(t, src, l.mediaType, l.data, l.ann))
			}
			b, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
				ArtifactType: tc.artifactType, Config: cfg, Layers: layers})
			desc := src.manifestDesc(b)
			c := openCache(t, t.TempDir(), Options{})
			if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
				t.Fatal(err)
			}
			dir, err := c.Acquire("v", desc.Digest, Selector{})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, line := range listTree(t, dir) {
				f := strings.Fields(line)
				got = append(got, f[0]+" "+f[1])
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("tree %v, want %v", got, tc.want)
			}
		})
	}
}
