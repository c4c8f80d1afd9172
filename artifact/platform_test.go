package artifact

import (
	"errors"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/internal/errdef"
)

func TestChoosePlatform(t *testing.T) {
	entry := func(name string, p *ocispec.Platform) ocispec.Descriptor {
		return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString(name), Size: 1, Platform: p}
	}
	amd64 := &ocispec.Platform{OS: "linux", Architecture: "amd64"}
	arm64 := &ocispec.Platform{OS: "linux", Architecture: "arm64"}
	armv8 := &ocispec.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}
	attest := &ocispec.Platform{OS: "unknown", Architecture: "unknown"}
	nested := entry("nested", nil)
	nested.MediaType = ocispec.MediaTypeImageIndex
	for _, tc := range []struct {
		name    string
		entries []ocispec.Descriptor
		want    ocispec.Platform
		pick    string
		err     error
	}{
		{"one entry without platform, any node", []ocispec.Descriptor{entry("model", nil)}, *arm64, "model", nil},
		{"exact match among several", []ocispec.Descriptor{entry("a", amd64), entry("b", arm64)}, *arm64, "b", nil},
		{"arm64 variant v8 is the default", []ocispec.Descriptor{entry("a", amd64), entry("b", armv8)}, *arm64, "b", nil},
		{"attestations are not candidates", []ocispec.Descriptor{entry("a", amd64), entry("att", attest)}, *amd64, "a", nil},
		{"one entry of another platform", []ocispec.Descriptor{entry("a", amd64)}, *arm64, "", errdef.ErrNotFound},
		{"several without platform", []ocispec.Descriptor{entry("a", nil), entry("b", nil)}, *amd64, "", ErrAmbiguousIndex},
		{"nested index skipped", []ocispec.Descriptor{nested}, *amd64, "", ErrAmbiguousIndex},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ChoosePlatform(ocispec.Index{Manifests: tc.entries}, tc.want)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("got %v, %v; want %v", got.Digest, err, tc.err)
				}
				return
			}
			if err != nil || got.Digest != digest.FromString(tc.pick) {
				t.Fatalf("got %v, %v; want %s", got.Digest, err, tc.pick)
			}
		})
	}
	if _, err := ParsePlatform("linux"); err == nil {
		t.Error("ParsePlatform accepted a platform without architecture")
	}
	if p, err := ParsePlatform("linux/arm/v7"); err != nil || p.Variant != "v7" {
		t.Errorf("ParsePlatform(linux/arm/v7) = %+v, %v", p, err)
	}
}
