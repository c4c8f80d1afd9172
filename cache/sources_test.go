package cache

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	mpremote "github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/internal/testenv"
)

// A pull from a registry that accepts the blob GET and never answers must not hold a pull of the same digest from
// a healthy registry that joins it: the healthy source takes over, and both callers get the content.
func TestStallingSourceHandsTheJoinedPullToAHealthyOne(t *testing.T) {
	files := []modelFile{{Path: "model.safetensors", Data: shard(7, 256<<10)}}
	stalling, healthy := testenv.StartHostileRegistry(t), testenv.StartHostileRegistry(t)
	mb := modelManifest(t, stalling, files)
	modelManifest(t, healthy, files)
	desc := stalling.Manifest(t, "v1", json.RawMessage(mb), ocispec.MediaTypeImageManifest)
	healthy.Manifest(t, "v1", json.RawMessage(mb), ocispec.MediaTypeImageManifest)
	weights := digest.FromBytes(files[0].Data)

	arrived := make(chan struct{})
	var once sync.Once
	stalling.OnBlob = func(w http.ResponseWriter, r *http.Request, d digest.Digest, _ []byte) bool {
		if d != weights {
			return false
		}
		once.Do(func() { close(arrived) })
		<-r.Context().Done() // accepts the GET and never answers
		return true
	}
	fast := mpremote.Timeouts{ResponseHeader: 200 * time.Millisecond, Idle: 200 * time.Millisecond, Attempts: 2}
	repo := func(h *testenv.HostileRegistry) *mpremote.Repository {
		r, _, err := mpremote.NewRepository(h.Host+"/m/model:v1", mpremote.Options{PlainHTTP: true,
			RegistryConfig: filepath.Join(t.TempDir(), "config.json"), Timeouts: fast})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	c := openCache(t, t.TempDir(), Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first := make(chan error, 1)
	go func() {
		_, err := c.Pull(ctx, repo(stalling), desc, nil)
		first <- err
	}()
	<-arrived // the first pull is stuck in the stalling registry's blob GET: join it from the healthy one
	got, err := c.Pull(ctx, repo(healthy), desc, nil)
	if err != nil {
		t.Fatalf("pull from the healthy registry, joined to the stalling one: %v", err)
	}
	if got.Digest != desc.Digest {
		t.Fatalf("pulled %s, want %s", got.Digest, desc.Digest)
	}
	if err := <-first; err != nil {
		t.Fatalf("the first caller failed although the content arrived: %v", err)
	}
	if healthy.Gets(weights) == 0 {
		t.Fatal("the healthy registry was never asked for the blob")
	}
	if err := c.blobs.Verify(weights); err != nil {
		t.Fatal(err)
	}
}
