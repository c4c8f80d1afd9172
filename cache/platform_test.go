package cache

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// A Pull of an index for a platform the caller names fetches the index once, mounts that platform's manifest
// and leaves the index's record to the node's platform: Resolve of the index still knows nothing until a Pull
// without a platform, which picks the node's.
func TestPullNamedPlatformOfIndex(t *testing.T) {
	src := newMemTarget()
	var entries []ocispec.Descriptor
	for _, arch := range []string{"amd64", "arm64"} {
		d := src.manifestDesc(modelManifest(t, src, []modelFile{{Path: "arch.txt", Data: []byte(arch)}}))
		d.Platform = &ocispec.Platform{OS: "linux", Architecture: arch}
		entries = append(entries, d)
	}
	ib, _ := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: entries})
	index := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageIndex, Digest: digest.FromBytes(ib), Size: int64(len(ib))}
	src.put(index.Digest, ib)
	c := openCache(t, t.TempDir(), Options{Platform: ocispec.Platform{OS: "linux", Architecture: "amd64"}})

	named := index
	named.Platform = &ocispec.Platform{OS: "linux", Architecture: "arm64"}
	got, err := c.Pull(context.Background(), src, named, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != entries[1].Digest {
		t.Fatalf("platform linux/arm64 pulled %s, want %s", got.Digest, entries[1].Digest)
	}
	if n := src.gets[index.Digest]; n != 1 {
		t.Fatalf("the index was fetched %d times, want once", n)
	}
	if _, err := c.Resolve(index.Digest); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after a pull for a named platform the index resolves (%v), want ErrNotFound", err)
	}
	// Pulled again for that platform: from the cache, the index fetched once more to choose.
	if again, err := c.Pull(context.Background(), src, named, nil); err != nil || again.Digest != got.Digest {
		t.Fatalf("second pull for linux/arm64: %s, %v", again.Digest, err)
	}
	if got, err = c.Pull(context.Background(), src, index, nil); err != nil || got.Digest != entries[0].Digest {
		t.Fatalf("pull for the node's platform: %s, %v; want %s", got.Digest, err, entries[0].Digest)
	}
	if m, err := c.Resolve(index.Digest); err != nil || m.Digest != entries[0].Digest {
		t.Fatalf("the index resolves to %s (%v), want the node's manifest %s", m.Digest, err, entries[0].Digest)
	}
}
