package cache

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	"github.com/prometheus/client_golang/prometheus/testutil"

	mpremote "github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/internal/testenv"
)

// A hosts.toml mirror in front of the real registry that fails in any way (a 500 to every request, a refused
// connection, a blob body that stalls half way, a byte flipped mid-stream) costs the pull one request to the
// mirror and none of its retries: the read moves to the origin at once (retries and backoff are the origin's,
// see package transfer), the pull completes with the origin's verified bytes, and a mirror that sent wrong bytes
// is counted by name in modelpack_cache_lying_sources_total. Requests are counted at each endpoint.
func TestFailingMirrorMovesThePullToTheOriginAtOnce(t *testing.T) {
	for _, fault := range []string{"500", "refused", "stall", "flip"} {
		t.Run(fault, func(t *testing.T) {
			reg := startRegistry(t)
			origin := newProxy(t, reg.Host)
			files := []modelFile{{Path: "model.safetensors", Data: shard(7, 2<<20)}, {Path: "config.json", Data: []byte(`{"a":1}`)}}
			desc := pushModel(t, newRepo(t, origin.Host, "m/model"), "v1", files)
			weights := digest.FromBytes(files[0].Data)
			weightsPath := "/v2/m/model/blobs/" + weights.String()

			var mu sync.Mutex
			mirrorGets := map[string]int{}
			mirror := testenv.StartProxy(t, reg.Host, testenv.ProxyHooks{
				Request: func(w http.ResponseWriter, r *http.Request) bool {
					mu.Lock()
					mirrorGets[r.URL.Path]++
					mu.Unlock()
					if fault == "500" {
						http.Error(w, "mirror broken", http.StatusInternalServerError)
						return false
					}
					return true
				},
				Response: func(resp *http.Response) {
					if resp.Request.URL.Path != weightsPath || resp.StatusCode != http.StatusOK {
						return
					}
					switch fault {
					case "stall":
						resp.Body = &stallingBody{rc: resp.Body, after: int64(len(files[0].Data) / 2), done: resp.Request.Context().Done()}
					case "flip":
						resp.Body = &flippingBody{rc: resp.Body, at: int64(len(files[0].Data) / 2)}
					}
				},
			})
			if fault == "refused" {
				mirror.Close()
			}
			// The idle limit is the stall bound the stalling mirror is cut off by; nothing here waits for it
			// otherwise.
			repo := mirroredRepo(t, origin.Host, mirror.Host, mpremote.Timeouts{ResponseHeader: 10 * time.Second, Idle: time.Second, Attempts: 8})
			c := openCache(t, t.TempDir(), Options{})
			if _, err := c.Pull(context.Background(), repo, desc, nil); err != nil {
				t.Fatalf("a pull whose mirror fails (%s): %v", fault, err)
			}
			if err := c.blobs.Verify(weights); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if fault != "refused" {
				if n := mirrorGets[weightsPath]; n != 1 {
					t.Fatalf("the mirror was asked for the weights %d times, want once (no retries at a mirror)", n)
				}
				for path, n := range mirrorGets {
					if n > 1 && fault == "500" {
						t.Fatalf("the mirror's 500 to %s was retried (%d requests)", path, n)
					}
				}
			}
			if n := origin.getCounts()[weightsPath]; n != 1 {
				t.Fatalf("the origin was asked for the weights %d times, want once", n)
			}
			lies := testutil.ToFloat64(c.m.lies.WithLabelValues(mirror.Host))
			if want := map[bool]float64{true: 1, false: 0}[fault == "flip"]; lies != want {
				t.Fatalf("the mirror %s was counted as lying %v times, want %v", mirror.Host, lies, want)
			}
		})
	}
}

// stallingBody sends the first after bytes of a blob, then nothing until the client hangs up.
type stallingBody struct {
	rc    io.ReadCloser
	after int64
	n     int64
	done  <-chan struct{}
}

func (s *stallingBody) Read(p []byte) (int, error) {
	if s.n >= s.after {
		<-s.done
		return 0, io.ErrUnexpectedEOF
	}
	p = p[:min(int64(len(p)), s.after-s.n)]
	n, err := s.rc.Read(p)
	s.n += int64(n)
	return n, err
}

func (s *stallingBody) Close() error { return s.rc.Close() }

// flippingBody inverts the byte at offset at of a blob it passes on: the right size, the wrong bytes.
type flippingBody struct {
	rc io.ReadCloser
	at int64
	n  int64
}

func (f *flippingBody) Read(p []byte) (int, error) {
	n, err := f.rc.Read(p)
	if f.at >= f.n && f.at < f.n+int64(n) {
		p[f.at-f.n] ^= 0xff
	}
	f.n += int64(n)
	return n, err
}

func (f *flippingBody) Close() error { return f.rc.Close() }
