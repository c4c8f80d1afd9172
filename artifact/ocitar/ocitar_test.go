package ocitar

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	oras "oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"
)

// artifactIn packs a one-layer artifact with a referrer into a memory store, tagged v1.
func artifactIn(t *testing.T) (*memory.Store, ocispec.Descriptor, ocispec.Descriptor) {
	t.Helper()
	ctx := context.Background()
	s := memory.New()
	layer := content.NewDescriptorFromBytes("application/vnd.cncf.model.weight.v1.raw", []byte("weights"))
	layer.Annotations = map[string]string{"org.cncf.model.filepath": "w.bin"}
	if err := s.Push(ctx, layer, bytes.NewReader([]byte("weights"))); err != nil {
		t.Fatal(err)
	}
	root, err := oras.PackManifest(ctx, s, oras.PackManifestVersion1_1, "application/vnd.cncf.model.manifest.v1+json", oras.PackManifestOptions{Layers: []ocispec.Descriptor{layer}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Tag(ctx, root, "v1"); err != nil {
		t.Fatal(err)
	}
	ref, err := oras.PackManifest(ctx, s, oras.PackManifestVersion1_1, "application/spdx+json", oras.PackManifestOptions{Subject: &root})
	if err != nil {
		t.Fatal(err)
	}
	return s, root, ref
}

func TestSaveThenOpenRoundTrip(t *testing.T) {
	ctx := context.Background()
	src, root, referrer := artifactIn(t)
	p := filepath.Join(t.TempDir(), "m.tar")
	if err := Save(p, func(w *Writer) error {
		if _, err := Copy(ctx, src, "v1", w, "v1", true); err != nil {
			return err
		}
		w.Name(root.Digest, "registry.local/org/m:v1")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	a, err := Open(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	r, err := a.Root()
	if err != nil || r.Digest != root.Digest || r.Tag != "v1" || r.Name != "registry.local/org/m:v1" {
		t.Fatalf("root %+v %v", r, err)
	}
	preds, err := a.Store.Predecessors(ctx, root)
	if err != nil || len(preds) != 1 || preds[0].Digest != referrer.Digest {
		t.Fatalf("the referrer did not travel: %v %v", preds, err)
	}
	dst := memory.New()
	if _, err := Copy(ctx, a.Store, root.Digest.String(), dst, "v1", true); err != nil {
		t.Fatal(err)
	}
	if ok, _ := dst.Exists(ctx, referrer); !ok {
		t.Fatal("the referrer was not copied out")
	}
}

// A blob whose bytes do not match its descriptor poisons the writer and leaves no file at the path.
func TestSaveRefusesWrongBytes(t *testing.T) {
	p := filepath.Join(t.TempDir(), "m.tar")
	err := Save(p, func(w *Writer) error {
		d := content.NewDescriptorFromBytes("application/octet-stream", []byte("right"))
		return w.Push(context.Background(), d, strings.NewReader("wrong"))
	})
	if err == nil {
		t.Fatal("a blob with the wrong content was written")
	}
	if _, serr := os.Stat(p); serr == nil {
		t.Fatal("a failed save left a file at its path")
	}
	if entries, _ := os.ReadDir(filepath.Dir(p)); len(entries) != 0 {
		t.Fatalf("a failed save left %v", entries)
	}
}

func FuzzOpen(f *testing.F) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range map[string]string{"oci-layout": `{"imageLayoutVersion":"1.0.0"}`, "index.json": `{"schemaVersion":2,"manifests":[]}`,
		"blobs/sha256/" + digest.FromString("x").Encoded(): "x"} {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(t.TempDir(), "f.tar")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		a, err := Open(context.Background(), p)
		if err != nil {
			return
		}
		// Whatever opened: every manifest it lists is complete.
		for _, e := range a.Entries {
			if _, err := content.Successors(context.Background(), a.Store, e.Descriptor); err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("an opened archive's manifest %s cannot be read: %v", e.Digest, err)
			}
		}
	})
}
