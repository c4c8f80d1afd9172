package remote

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/oci"

	"github.com/modelpack/modelpack/artifact"
)

// pushLayers packs the given layers (blob, media type, annotations) as one artifact and pushes it to ref.
func pushLayers(t *testing.T, ref string, opts Options, layers ...ocispec.Descriptor) {
	t.Helper()
	ctx := context.Background()
	store, err := oci.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var descs []ocispec.Descriptor
	for _, l := range layers {
		b := []byte(l.Annotations["test.body"])
		delete(l.Annotations, "test.body")
		d := content.NewDescriptorFromBytes(l.MediaType, b)
		d.Annotations = l.Annotations
		if err := store.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		descs = append(descs, d)
	}
	desc, err := oras.PackManifest(ctx, store, oras.PackManifestVersion1_1, "application/vnd.test.artifact", oras.PackManifestOptions{Layers: descs})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Tag(ctx, desc, "v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := Push(ctx, store, "v1", repoFor(t, ref, opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A container-image layer may hold absolute symlinks; a fetch writing into the same directory afterwards must not
// follow one out of it.
func TestFetchDoesNotWriteThroughSymlinksOutOfTheDestination(t *testing.T) {
	reg, opts := plainRegistry(t)
	ctx := context.Background()
	outside := t.TempDir()

	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "evil", Typeflag: tar.TypeSymlink, Linkname: outside, Mode: 0o777})
	tw.Close()
	pushLayers(t, reg.Host+"/x/image:v1", opts, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer,
		Annotations: map[string]string{"test.body": tb.String()}})

	tb.Reset()
	tw = tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "evil/from-tar", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("t"))
	tw.Close()
	pushLayers(t, reg.Host+"/x/model:v1", opts,
		ocispec.Descriptor{MediaType: artifact.LayerMediaType(artifact.KindWeight, artifact.FormatRaw),
			Annotations: map[string]string{artifact.AnnotationFilepath: "evil/from-raw", "test.body": "r"}},
		ocispec.Descriptor{MediaType: artifact.LayerMediaType(artifact.KindDoc, artifact.FormatTar),
			Annotations: map[string]string{artifact.AnnotationFilepath: "evil", "test.body": tb.String()}})

	dir := t.TempDir()
	if _, err := Fetch(ctx, repoFor(t, reg.Host+"/x/image:v1", opts), dir, FetchOptions{}); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "evil")); err != nil || target != outside {
		t.Fatalf("image symlink: %q %v", target, err)
	}
	_, err := Fetch(ctx, repoFor(t, reg.Host+"/x/model:v1", opts), dir, FetchOptions{})
	t.Log(err)
	entries, _ := os.ReadDir(outside)
	for _, e := range entries {
		t.Errorf("fetch wrote %s outside the destination", filepath.Join(outside, e.Name()))
	}
}
