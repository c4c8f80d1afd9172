package cachebackend

import (
	"context"
	"crypto/rand"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/cache"
	"github.com/modelpack/modelpack/csidriver"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
	"github.com/modelpack/modelpack/prepull"
)

// pushModel pushes a one-weight ModelPack artifact as repo:v1 and returns its manifest digest.
func pushModel(t *testing.T, host, repo string, weight []byte) digest.Digest {
	t.Helper()
	return testmodel.Push(t, host, repo, "v1", map[string][]byte{"model.safetensors": weight}, nil)
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
	be := New(c, Options{Remote: remote.Options{RegistryConfig: testenv.EmptyDockerConfig(t), PlainHTTPHosts: []string{reg.Host}},
		Verifier: verify}).Prepuller(&recorded, 2<<20)
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
