package testmodel

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/modelpack/modelpack/artifact"
)

// Push pushes files (path → content) to the plain-HTTP registry host as the ModelPack artifact repo:tag — one raw
// layer per file, its kind from its name, as `modelpack pack` lays a directory out — with cred if not nil, and
// returns the manifest's digest. It builds the artifact with oras-go, not with modelpack, so what a test reads
// back was not written by the code under test.
func Push(t testing.TB, host, repo, tag string, files map[string][]byte, cred *auth.Credential) digest.Digest {
	t.Helper()
	ctx := context.Background()
	mem := memory.New()
	push := func(mt string, b []byte, ann map[string]string) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mt, Digest: digest.FromBytes(b), Size: int64(len(b)), Annotations: ann}
		if err := mem.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	var layers []ocispec.Descriptor
	var diffIDs []digest.Digest
	for _, name := range slices.Sorted(maps.Keys(files)) {
		kind := artifact.KindOf(name)
		d := push(artifact.LayerMediaType(kind, artifact.FormatRaw), files[name], map[string]string{
			artifact.AnnotationFilepath: name, artifact.AnnotationTitle: name,
		})
		layers = append(layers, d)
		diffIDs = append(diffIDs, d.Digest)
	}
	cfg, err := json.Marshal(artifact.Model{
		Descriptor: artifact.ModelDescriptor{Name: repo + "-" + tag},
		Config:     artifact.ModelConfig{Format: "safetensors"},
		ModelFS:    artifact.ModelFS{Type: "layers", DiffIDs: diffIDs},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfgDesc := push(artifact.MediaTypeModelConfig, cfg, nil)
	man, err := json.Marshal(ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: artifact.ArtifactTypeModelManifest,
		Config:       cfgDesc,
		Layers:       layers,
	})
	if err != nil {
		t.Fatal(err)
	}
	manDesc := push(ocispec.MediaTypeImageManifest, man, nil)
	if err := mem.Tag(ctx, manDesc, tag); err != nil {
		t.Fatal(err)
	}
	r, err := remote.NewRepository(host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	r.PlainHTTP = true
	if cred != nil {
		r.Client = &auth.Client{Credential: auth.StaticCredential(host, *cred)}
	}
	if _, err := oras.Copy(ctx, mem, tag, r, tag, oras.DefaultCopyOptions); err != nil {
		t.Fatal(err)
	}
	return manDesc.Digest
}

// Tar is an uncompressed tar of regular files (mode 0644, a fixed time), given as name, body pairs in order: a tar
// layer of a model.
func Tar(t testing.TB, nameBody ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i+1 < len(nameBody); i += 2 {
		hdr := &tar.Header{Name: nameBody[i], Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(nameBody[i+1])), ModTime: time.Unix(1e9, 0)}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(nameBody[i+1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
