package cache

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus/testutil"

	mpremote "github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/internal/testenv"
)

// A hosts.toml mirror that tampers with a blob (the right size, wrong bytes) or cuts it short (the full length
// declared, the connection closed half way) does not fail the pull: the blob is fetched again from the next
// endpoint, the origin, and the mirror is not asked for it again; the pull completes with the origin's verified
// bytes. The origin is a real registry; the mirror is a hostile one holding the same model.
func TestLyingMirrorHandsTheBlobToTheOrigin(t *testing.T) {
	for _, lie := range []string{"tampered", "truncated"} {
		t.Run(lie, func(t *testing.T) {
			reg := startRegistry(t)
			origin := newProxy(t, reg.Host)
			files := []modelFile{{Path: "model.safetensors", Data: shard(3, 1<<20)}, {Path: "config.json", Data: []byte(`{"a":1}`)}}
			desc := pushModel(t, newRepo(t, origin.Host, "m/model"), "v1", files)
			weights := digest.FromBytes(files[0].Data)

			mirror := testenv.StartHostileRegistry(t)
			var m ocispec.Manifest
			mb := modelManifest(t, mirror, files)
			if err := json.Unmarshal(mb, &m); err != nil {
				t.Fatal(err)
			}
			mirror.Raw("v1", ocispec.MediaTypeImageManifest, mb)
			mirror.OnBlob = func(w http.ResponseWriter, r *http.Request, d digest.Digest, content []byte) bool {
				if d != weights {
					return false
				}
				w.Header().Set("Content-Length", strconv.Itoa(len(content)))
				w.WriteHeader(http.StatusOK)
				if lie == "truncated" {
					w.Write(content[:len(content)/2])
					panic(http.ErrAbortHandler) // the connection drops half way
				}
				bad := append([]byte(nil), content...)
				bad[len(bad)/2] ^= 0xff
				w.Write(bad)
				return true
			}
			repo := mirroredRepo(t, origin.Host, mirror.Host, mpremote.Timeouts{ResponseHeader: 5 * time.Second, Idle: 5 * time.Second, Attempts: 2})
			c := openCache(t, t.TempDir(), Options{})
			if _, err := c.Pull(context.Background(), repo, desc, nil); err != nil {
				t.Fatalf("a pull whose mirror %s a blob: %v", lie, err)
			}
			if err := c.blobs.Verify(weights); err != nil {
				t.Fatal(err)
			}
			if mirror.Gets(weights) == 0 {
				t.Fatal("the mirror was never asked for the weights: the test tested nothing")
			}
			if n := origin.getCounts()["/v2/m/model/blobs/"+weights.String()]; n == 0 {
				t.Fatal("the origin was never asked for the weights the mirror lied about")
			}
			if lie == "tampered" {
				if n := testutil.ToFloat64(c.m.lies.WithLabelValues(mirror.Host)); n != 1 {
					t.Fatalf("the lying mirror %s was counted %v times, want once", mirror.Host, n)
				}
			}
		})
	}
}
