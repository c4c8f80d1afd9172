package cache

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/archive"
)

// TestHostileArtifacts has one case per kind of hostile content the issue lists. Each pull must fail with its
// precise error, or neutralise the content, and write nothing outside the cache root.
func TestHostileArtifacts(t *testing.T) {
	codeTar := func(entries ...tarEntry) modelFile {
		return modelFile{Path: "code", Data: makeTar(t, true, entries...), Kind: artifact.KindCode, Format: artifact.FormatTarGzip}
	}
	weights := modelFile{Path: "w.safetensors", Data: shard(1, 4096)}
	var bomb bytes.Buffer
	{
		// 32 MiB of zeros: ~32 KiB compressed; the cache's 1 MiB limit must stop it.
		zw := gzip.NewWriter(&bomb)
		zw.Write(makeTar(t, false, tarEntry{Name: "zeros", Body: string(make([]byte, 32<<20))}))
		zw.Close()
	}
	var many []tarEntry
	for i := range 200 {
		many = append(many, tarEntry{Name: "f" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26))})
	}

	type hostile struct {
		name string
		// build returns the descriptor to pull from src.
		build func(t *testing.T, src *memTarget) ocispec.Descriptor
		want  error
		text  string // part of the error message
	}
	model := func(files ...modelFile) func(*testing.T, *memTarget) ocispec.Descriptor {
		return func(t *testing.T, src *memTarget) ocispec.Descriptor {
			return src.manifestDesc(modelManifest(t, src, files))
		}
	}
	cases := []hostile{
		// ".." and absolute paths.
		{"tar-dotdot", model(weights, codeTar(tarEntry{Name: "../../evil", Body: "x"})), archive.ErrUnsafePath, `"../../evil" has a ".." component`},
		{"tar-absolute", model(weights, codeTar(tarEntry{Name: "/tmp/evil", Body: "x"})), archive.ErrUnsafePath, "is absolute"},
		{"filepath-dotdot", model(modelFile{Path: "../../evil.safetensors", Data: shard(2, 10)}), ErrUnsupported, "escapes the model root"},
		{"filepath-inner-dotdot", model(modelFile{Path: "a/../../evil.safetensors", Data: shard(2, 10)}), ErrUnsupported, "escapes the model root"},
		{"filepath-absolute", model(modelFile{Path: "/etc/evil.safetensors", Data: shard(2, 10)}), ErrUnsupported, "must be relative"},
		// Symlinks and hardlinks that escape.
		{"symlink-escape", model(weights, codeTar(tarEntry{Name: "code/evil", Type: '2', Link: "../../../../etc"})), archive.ErrLinkEscape, "points outside"},
		{"symlink-absolute", model(weights, codeTar(tarEntry{Name: "code/evil", Type: '2', Link: "/etc/shadow"})), archive.ErrLinkEscape, "is absolute"},
		{"symlink-then-write", model(weights, codeTar(tarEntry{Name: "code/l", Type: '2', Link: "."}, tarEntry{Name: "code/l/evil", Body: "x"})), archive.ErrUnsafePath, "goes through symlink"},
		{"hardlink-escape", model(weights, codeTar(tarEntry{Name: "code/evil", Type: '1', Link: "../../etc/passwd"})), archive.ErrLinkEscape, "points outside"},
		{"hardlink-absolute", model(weights, codeTar(tarEntry{Name: "code/evil", Type: '1', Link: "/etc/passwd"})), archive.ErrLinkEscape, "points outside"},
		// Device nodes and fifos.
		{"char-device", model(weights, codeTar(tarEntry{Name: "code/evil", Type: '3'})), archive.ErrSpecialFile, "character device"},
		{"block-device", model(weights, codeTar(tarEntry{Name: "code/evil", Type: '4'})), archive.ErrSpecialFile, "block device"},
		{"fifo", model(weights, codeTar(tarEntry{Name: "code/evil", Type: '6'})), archive.ErrSpecialFile, "fifo"},
		// Decompression bombs: size and file count over the configured limits.
		{"bomb-bytes", model(weights, modelFile{Path: "data", Data: bomb.Bytes(), Kind: artifact.KindDataset, Format: artifact.FormatTarGzip}), ErrTooLarge, "past 1048576 bytes"},
		{"bomb-files", model(weights, codeTar(many...)), ErrTooLarge, "more than 100 entries"},
		// Manifests and configs over 4 MiB.
		{"manifest-too-large", func(t *testing.T, src *memTarget) ocispec.Descriptor {
			b := modelManifest(t, src, []modelFile{weights})
			var m map[string]any
			json.Unmarshal(b, &m)
			m["annotations"] = map[string]string{"pad": strings.Repeat("x", 5<<20)}
			b, _ = json.Marshal(m)
			return src.manifestDesc(b)
		}, ErrTooLarge, "limit 4194304"},
		{"manifest-lies-about-size", func(t *testing.T, src *memTarget) ocispec.Descriptor {
			b := modelManifest(t, src, []modelFile{weights})
			d := src.manifestDesc(b)
			src.put(d.Digest, append(b, bytes.Repeat([]byte(" "), 5<<20)...))
			return d
		}, ErrSizeMismatch, "want"},
		{"config-too-large", func(t *testing.T, src *memTarget) ocispec.Descriptor {
			cfg := pushBlob(t, src, artifact.MediaTypeModelConfig, bytes.Repeat([]byte("{}"), 3<<20), nil)
			w := pushBlob(t, src, artifact.LayerMediaType(artifact.KindWeight, artifact.FormatRaw), weights.Data, map[string]string{artifact.AnnotationFilepath: "w"})
			b, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
				ArtifactType: artifact.ArtifactTypeModelManifest, Config: cfg, Layers: []ocispec.Descriptor{w}})
			return src.manifestDesc(b)
		}, ErrTooLarge, "config"},
		// Descriptors whose size or digest do not match the bytes.
		{"layer-size-mismatch", func(t *testing.T, src *memTarget) ocispec.Descriptor {
			d := src.manifestDesc(modelManifest(t, src, []modelFile{weights}))
			src.put(digest.FromBytes(weights.Data), append(append([]byte(nil), weights.Data...), "more"...))
			return d
		}, ErrSizeMismatch, "got 4097 bytes, want 4096"},
		{"layer-short", func(t *testing.T, src *memTarget) ocispec.Descriptor {
			d := src.manifestDesc(modelManifest(t, src, []modelFile{weights}))
			src.put(digest.FromBytes(weights.Data), weights.Data[:100])
			return d
		}, ErrSizeMismatch, "got 100 bytes, want 4096"},
		{"layer-digest-mismatch", func(t *testing.T, src *memTarget) ocispec.Descriptor {
			d := src.manifestDesc(modelManifest(t, src, []modelFile{weights}))
			evil := bytes.Clone(weights.Data)
			evil[10] ^= 1
			src.put(digest.FromBytes(weights.Data), evil)
			return d
		}, ErrDigestMismatch, "the bytes were dropped"},
		{"manifest-digest-mismatch", func(t *testing.T, src *memTarget) ocispec.Descriptor {
			b := modelManifest(t, src, []modelFile{weights})
			d := src.manifestDesc(b)
			evil := bytes.Clone(b)
			evil[len(evil)-1] = ' '
			src.put(d.Digest, evil)
			return d
		}, ErrDigestMismatch, "the bytes hash to"},
		{"config-digest-mismatch", func(t *testing.T, src *memTarget) ocispec.Descriptor {
			b := modelManifest(t, src, []modelFile{weights})
			var m ocispec.Manifest
			json.Unmarshal(b, &m)
			src.put(m.Config.Digest, bytes.Repeat([]byte("x"), int(m.Config.Size)))
			return src.manifestDesc(b)
		}, ErrDigestMismatch, "config"},
		// Unknown media types are named.
		{"unknown-layer-type", func(t *testing.T, src *memTarget) ocispec.Descriptor {
			cfg := pushBlob(t, src, artifact.MediaTypeModelConfig, []byte("{}"), nil)
			l := pushBlob(t, src, "application/vnd.example.mystery.v1", []byte("?"), nil)
			b, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, Config: cfg, Layers: []ocispec.Descriptor{l}})
			return src.manifestDesc(b)
		}, ErrUnsupported, `"application/vnd.example.mystery.v1"`},
		{"unknown-manifest-type", func(t *testing.T, src *memTarget) ocispec.Descriptor {
			b := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.example.list+json"}`)
			d := src.manifestDesc(b)
			d.MediaType = "application/vnd.example.list+json"
			return d
		}, ErrUnsupported, `"application/vnd.example.list+json"`},
		{"schema1", func(t *testing.T, src *memTarget) ocispec.Descriptor {
			b := []byte(`{"schemaVersion":1,"name":"x","tag":"y","fsLayers":[]}`)
			d := src.manifestDesc(b)
			d.MediaType = mediaTypeDockerSchema1Sig
			return d
		}, ErrUnsupported, "schema 1"},
	}
	for _, hc := range cases {
		t.Run(hc.name, func(t *testing.T) {
			parent := t.TempDir()
			root := filepath.Join(parent, "cache")
			c := openCache(t, root, Options{Limits: archive.Limits{MaxBytes: 1 << 20, MaxFiles: 100}})
			src := newMemTarget()
			desc := hc.build(t, src)
			_, err := c.Pull(context.Background(), src, desc, nil)
			if !errors.Is(err, hc.want) || !strings.Contains(err.Error(), hc.text) {
				t.Fatalf("err = %v\nwant %v containing %q", err, hc.want, hc.text)
			}
			t.Logf("refused: %v", err)
			if c.Has(desc.Digest) {
				t.Error("hostile manifest recorded as complete")
			}
			if _, err := c.Acquire("v", desc.Digest, Selector{}); !errors.Is(err, ErrNotFound) {
				t.Errorf("acquire of a refused manifest: %v", err)
			}
			assertContained(t, parent, root)
		})
	}
}

// assertContained checks that nothing exists beside the cache root, that no half-extracted tree is left, and that
// no layer or view holds an escaping link or special file.
func assertContained(t *testing.T, parent, root string) {
	t.Helper()
	onlyChild(t, parent, "cache")
	for _, d := range []string{"tmp", "views", "layers/sha256"} {
		if entries, _ := os.ReadDir(filepath.Join(root, d)); len(entries) != 0 {
			t.Errorf("%s holds %d entries after a refused pull", d, len(entries))
		}
	}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if strings.Contains(d.Name(), "evil") {
			t.Errorf("hostile entry written: %s", p)
		}
		return nil
	})
}

// TestSetuidNeutralised: setuid and setgid bits are stripped, not refused.
func TestSetuidNeutralised(t *testing.T) {
	parent := t.TempDir()
	root := filepath.Join(parent, "cache")
	c := openCache(t, root, Options{})
	src := newMemTarget()
	desc := src.manifestDesc(modelManifest(t, src, []modelFile{{Path: "code", Kind: artifact.KindCode, Format: artifact.FormatTarGzip,
		Data: makeTar(t, true, tarEntry{Name: "code/suid", Body: "#!/bin/sh\n", Mode: 0o4755}, tarEntry{Name: "code/sgid", Body: "x", Mode: 0o2711})}}))
	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	dir, err := c.Acquire("v", desc.Digest, Selector{})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]fs.FileMode{"suid": 0o555, "sgid": 0o555} {
		fi, err := os.Stat(filepath.Join(dir, "code", name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode(), want)
		}
	}
	onlyChild(t, parent, "cache")
}

// FuzzParseManifest: arbitrary manifest bytes never panic, and an accepted manifest only places files inside the
// model root.
func FuzzParseManifest(f *testing.F) {
	src := newMemTarget()
	f.Add(modelManifest(f, src, sampleModel(f, 1)))
	f.Add([]byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:` + strings.Repeat("a", 64) + `","size":10,"platform":{"os":"linux","architecture":"amd64"}}]}`))
	f.Add([]byte(`{"schemaVersion":2,"config":{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"sha256:` + strings.Repeat("b", 64) + `","size":3},"layers":[{"mediaType":"application/vnd.docker.image.rootfs.diff.tar.gzip","digest":"sha256:` + strings.Repeat("c", 64) + `","size":5}]}`))
	f.Add([]byte(`{"schemaVersion":2,"config":{"digest":"sha256:` + strings.Repeat("b", 64) + `","size":3},"layers":[{"mediaType":"application/vnd.cncf.model.weight.v1.raw","digest":"sha256:` + strings.Repeat("c", 64) + `","size":5,"annotations":{"org.cncf.model.filepath":"../x"}}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		desc := ocispec.Descriptor{Digest: digest.FromBytes(b), Size: int64(len(b))}
		p, err := parseManifest(desc, b)
		if err != nil {
			return
		}
		if (p.manifest == nil) == (p.index == nil) {
			t.Fatalf("parsed both or neither: %+v", p)
		}
		if p.index != nil {
			choosePlatform(p.index, ocispec.Platform{OS: "linux", Architecture: "amd64"})
			return
		}
		for _, l := range p.layers {
			if l.Digest.Validate() != nil || l.Size < 0 {
				t.Fatalf("invalid descriptor accepted: %+v", l.Descriptor)
			}
			if l.Format == artifact.FormatRaw && !l.Image {
				if c, err := archive.CleanPath(l.Path); err != nil || c != l.Path || c == "" {
					t.Fatalf("unsafe file path accepted: %q", l.Path)
				}
			}
		}
	})
}

// TestImageLayerReusedByModel: absolute symlinks are accepted in image layers only; the same layer digest used as a
// model layer does not bring them into a model's view.
func TestImageLayerReusedByModel(t *testing.T) {
	src := newMemTarget()
	layer := makeTar(t, false, tarEntry{Name: "bin/tool", Body: "#!"}, tarEntry{Name: "bin/sh", Type: '2', Link: "/bin/tool"})
	cfg := pushBlob(t, src, "application/vnd.oci.image.config.v1+json", []byte(`{"architecture":"amd64","os":"linux"}`), nil)
	l := pushBlob(t, src, ocispec.MediaTypeImageLayer, layer, nil)
	img, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, Config: cfg, Layers: []ocispec.Descriptor{l}})
	imgDesc := src.manifestDesc(img)
	model := src.manifestDesc(modelManifest(t, src, []modelFile{{Path: "bin", Data: layer, Kind: artifact.KindCode, Format: artifact.FormatTar}}))

	c := openCache(t, t.TempDir(), Options{})
	ctx := context.Background()
	if _, err := c.Pull(ctx, src, imgDesc, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire("img", imgDesc.Digest, Selector{}); err != nil {
		t.Fatalf("image with an absolute symlink: %v", err)
	}
	if _, err := c.Pull(ctx, src, model, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire("model", model.Digest, Selector{}); !errors.Is(err, archive.ErrLinkEscape) {
		t.Fatalf("model reusing the image layer: %v, want ErrLinkEscape", err)
	}
	// In a cache that meets the model first, the extraction itself refuses.
	c2 := openCache(t, t.TempDir(), Options{})
	if _, err := c2.Pull(ctx, src, model, nil); !errors.Is(err, archive.ErrLinkEscape) {
		t.Fatalf("model with an absolute symlink: %v", err)
	}
}
