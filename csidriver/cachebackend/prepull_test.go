package cachebackend

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content/memory"
	orasremote "oras.land/oras-go/v2/registry/remote"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/cache"
	"github.com/modelpack/modelpack/csidriver"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/prepull"
)

// pushModel pushes a one-weight ModelPack artifact and returns its manifest digest.
func pushModel(t *testing.T, host, repo string, weight []byte) digest.Digest {
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
	layer := push(artifact.LayerMediaType(artifact.KindWeight, artifact.FormatRaw), weight,
		map[string]string{artifact.AnnotationFilepath: "model.safetensors", artifact.AnnotationTitle: "model.safetensors"})
	cfg, _ := json.Marshal(artifact.Model{ModelFS: artifact.ModelFS{Type: "layers", DiffIDs: []digest.Digest{layer.Digest}}})
	man, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		ArtifactType: artifact.ArtifactTypeModelManifest, Config: push(artifact.MediaTypeModelConfig, cfg, nil), Layers: []ocispec.Descriptor{layer}})
	md := push(ocispec.MediaTypeImageManifest, man, nil)
	if err := mem.Tag(ctx, md, "v1"); err != nil {
		t.Fatal(err)
	}
	r, err := orasremote.NewRepository(host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	r.PlainHTTP = true
	if _, err := oras.Copy(ctx, mem, "v1", r, "v1", oras.DefaultCopyOptions); err != nil {
		t.Fatal(err)
	}
	return md.Digest
}

// recordedImages is an ImageRecorder that keeps what it is told, one "ref|platform|digest|manifest" a record.
type recordedImages []string

func (r *recordedImages) RecordImage(ref, platform string, dgst, manifest digest.Digest) error {
	*r = append(*r, strings.Join([]string{ref, platform, dgst.String(), manifest.String()}, "|"))
	return nil
}

// TestPrepuller drives the real cache from a real registry: the verifier sees the digest reference a mount
// would, the bandwidth cap holds, a pull is recorded for mounts, and pins are cache references named pin:<name>.
func TestPrepuller(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	weight := make([]byte, 1<<20)
	rand.Read(weight)
	dig := pushModel(t, reg.Host, "models/a", weight)
	c, err := cache.Open(cache.Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var checked []string
	var recorded recordedImages
	verify := VerifierFunc(func(_ context.Context, digestRef string) error {
		checked = append(checked, digestRef)
		if digestRef == reg.Host+"/models/denied@"+dig.String() {
			return errors.New("denied: no signature")
		}
		return nil
	})
	be := New(c, Options{Remote: remote.Options{RegistryConfig: writeEmptyDockerConfig(t)},
		PlainHTTPRegistries: []string{reg.Host}, Verifier: verify}).Prepuller(&recorded, 2<<20)
	ctx := context.Background()
	ref := reg.Host + "/models/a:v1"

	desc, err := be.Resolve(ctx, ref)
	if err != nil || desc.Digest != dig {
		t.Fatalf("Resolve = %v, %v; want %s", desc.Digest, err, dig)
	}
	if err := be.Verify(ctx, ref, desc); err != nil {
		t.Fatal(err)
	}
	if err := be.Verify(ctx, reg.Host+"/models/denied:v1", desc); err == nil {
		t.Error("the verifier's refusal was not returned")
	}
	if want := []string{reg.Host + "/models/a@" + dig.String(), reg.Host + "/models/denied@" + dig.String()}; !slices.Equal(checked, want) {
		t.Errorf("verified %q, want %q", checked, want)
	}

	start := time.Now()
	var last int64
	manifest, err := be.Pull(ctx, ref, desc, func(done, total int64) { last = done })
	if err != nil || manifest != dig {
		t.Fatalf("Pull = %s, %v", manifest, err)
	}
	// 1 MiB at 2 MiB/s with a burst of a tenth of that: at least ~0.4 s.
	if el := time.Since(start); el < 400*time.Millisecond {
		t.Errorf("1 MiB under a 2 MiB/s cap took only %s", el)
	}
	if last < int64(len(weight)) {
		t.Errorf("last progress %d, want ≥ %d", last, len(weight))
	}
	if want := (recordedImages{ref + "||" + dig.String() + "|" + dig.String()}); !slices.Equal(recorded, want) {
		t.Errorf("recorded %q, want %q", recorded, want)
	}

	if err := be.Pin(ctx, prepull.PinName("l", ref), manifest); err != nil {
		t.Fatal(err)
	}
	pins, err := be.Pins(ctx)
	if err != nil || pins[prepull.PinName("l", ref)] != dig || len(pins) != 1 {
		t.Fatalf("Pins = %v, %v", pins, err)
	}
	es, err := be.Cache(ctx)
	if err != nil || len(es) != 1 || es[0].Digest != dig || !es[0].Complete || !slices.Equal(es[0].Owners, []string{"pin:" + prepull.PinName("l", ref)}) {
		t.Fatalf("Cache = %+v, %v", es, err)
	}
	if err := be.Unpin(ctx, prepull.PinName("l", ref)); err != nil {
		t.Fatal(err)
	}
	if err := be.Unpin(ctx, prepull.PinName("l", ref)); err != nil {
		t.Errorf("unpinning twice: %v", err)
	}
	if pins, _ := be.Pins(ctx); len(pins) != 0 {
		t.Errorf("pins after Unpin: %v", pins)
	}
	if _, err := be.Resolve(ctx, reg.Host+"/models/missing:v1"); err == nil || !errors.Is(err, remote.ErrNotFound) {
		t.Errorf("Resolve of a missing model = %v, want not found", err)
	}
	// Prepulls are classified as mounts are: the same causes, the same words.
	if _, err := be.Resolve(ctx, "Not A Reference"); !errors.Is(err, csidriver.ErrInvalidReference) {
		t.Errorf("Resolve of a bad reference = %v, want ErrInvalidReference", err)
	}
}

func writeEmptyDockerConfig(t *testing.T) string {
	t.Helper()
	p := t.TempDir() + "/config.json"
	// An empty docker config keeps the host's credentials out of the test.
	if err := os.WriteFile(p, []byte(`{"auths":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
