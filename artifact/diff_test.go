package artifact

import (
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func rawLayer(path, body string) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: "application/vnd.cncf.model.weight.v1.raw", Digest: digest.FromString(body), Size: int64(len(body)),
		Annotations: map[string]string{AnnotationFilepath: path}}
}

func TestDiffManifests(t *testing.T) {
	cfg1 := ocispec.Descriptor{MediaType: MediaTypeModelConfig, Digest: digest.FromString("c1"), Size: 2}
	cfg2 := ocispec.Descriptor{MediaType: MediaTypeModelConfig, Digest: digest.FromString("c2"), Size: 2}
	from := ocispec.Manifest{Config: cfg1, Layers: []ocispec.Descriptor{rawLayer("a", "A"), rawLayer("b", "B"), rawLayer("gone", "G")}}
	to := ocispec.Manifest{Config: cfg2, Layers: []ocispec.Descriptor{
		rawLayer("a", "A"),          // unchanged
		rawLayer("b", "BBBB"),       // changed: 4 bytes
		rawLayer("moved/gone", "G"), // added, but its content is held: nothing to fetch
		rawLayer("new", "NNNNNN"),   // added: 6 bytes
		rawLayer("twin", "NNNNNN"),  // the same content again: counted once
	}}
	d, err := DiffManifests(from, to)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Added) != 3 || len(d.Removed) != 1 || d.Removed[0].Path != "gone" || len(d.Changed) != 1 || d.Changed[0].Path != "b" || d.Unchanged != 1 || !d.ConfigChanged {
		t.Fatalf("%+v", d)
	}
	if d.FetchBytes != 2+4+6 || len(d.Fetch) != 3 {
		t.Fatalf("fetch %d bytes in %d blobs, want 12 in 3 (config, b, new once)", d.FetchBytes, len(d.Fetch))
	}
	if d.TotalBytes != 2+1+4+1+6 {
		t.Fatalf("total %d", d.TotalBytes)
	}
}
