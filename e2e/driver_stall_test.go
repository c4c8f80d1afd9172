package e2e

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// drvStallCase is a model on a healthy real registry and the same manifest on a StallServer that stalls its blobs.
type drvStallCase struct {
	healthy *testenv.Registry
	proxy   *drvProxy
	stalled *testenv.StallServer
	weights []byte
	d       *drvProc
}

func newDrvStallCase(t *testing.T, dir string, mode testenv.StallMode) *drvStallCase {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	s := &drvStallCase{healthy: reg, proxy: drvStartProxy(t, reg.Host), stalled: testenv.StartStallServer(t, mode),
		weights: randomBytes(t, 4<<20)}
	testmodel.Push(t, reg.Host, "m/model", "v1", drvModel{"model.safetensors": s.weights, "config.json": []byte("{}")}, nil)
	req, _ := http.NewRequest(http.MethodGet, "http://"+reg.Host+"/v2/m/model/manifests/v1", nil)
	req.Header.Set("Accept", ocispec.MediaTypeImageManifest)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("manifest: %v %s", err, resp.Status)
	}
	s.stalled.Serve("v1", ocispec.MediaTypeImageManifest, b)
	// The stalled registry's limits are an hour: only a driver that stops waiting on a source its caller did not
	// name can pass.
	s.d = drvStartWith(t, filepath.Join(dir, "node"), []string{"--registry-idle-timeout", "1h", "--registry-response-timeout", "1h"},
		s.proxy.Host, s.stalled.Host)
	return s
}

// waitStalled waits for the StallServer to read a blob GET, which it will never finish answering.
func (s *drvStallCase) waitStalled(t *testing.T) {
	t.Helper()
	for {
		select {
		case line := <-s.stalled.Requests():
			if strings.HasPrefix(line, "GET /v2/m/model/blobs/") {
				return
			}
		case <-time.After(time.Minute): // a failure guard, never the condition
			t.Fatal("the stalled registry never received a blob GET")
		}
	}
}

// publish publishes ref at a new target with kubelet's deadline and returns the target and the error.
func (s *drvStallCase) publish(t *testing.T, dir, vol, ref string) (string, error) {
	target := drvKubelet(t, dir, "pod-"+vol)
	return target, drvPublish(s.d.node(), testenv.PublishRequest(vol, target, map[string]string{"reference": ref}), 2*time.Minute)
}

func (s *drvStallCase) wantWeights(t *testing.T, target string) {
	t.Helper()
	if got, _ := os.ReadFile(filepath.Join(target, "model.safetensors")); !bytes.Equal(got, s.weights) {
		t.Fatal("the mounted weights differ from what was pushed")
	}
}

// A publish from a registry that answers manifests and then stalls its blobs (no answer, or the headers and then
// nothing) holds a pull of the digest; a publish of the same digest from a healthy registry must not wait on it:
// its first NodePublishVolume succeeds (no ABORTED loop) while the stalled registry, whose limits are an hour, has
// been sent nothing past its requests. The stalled publish is not handed the content the healthy registry
// delivered: its own registry does not serve those blobs (it stalls their GETs and has no answer to a HEAD), so
// it is refused with NOT_FOUND naming a blob, and nothing is mounted for it.
func TestDriverStalledRegistryNeverHoldsAHealthyPublish(t *testing.T) {
	for _, mode := range []struct {
		name string
		mode testenv.StallMode
	}{{"blob never answered", testenv.StallBlobs}, {"blob headers then nothing", testenv.StallBlobBodies}} {
		t.Run(mode.name+"/stalled first", func(t *testing.T) {
			testenv.RequireRoot(t)
			dir := t.TempDir()
			drvCleanupMounts(t, dir)
			s := newDrvStallCase(t, dir, mode.mode)
			stalledDone := make(chan error, 1)
			var stalledTarget string
			go func() {
				var err error
				stalledTarget, err = s.publish(t, dir, "stalled", s.stalled.Host+"/m/model:v1")
				stalledDone <- err
			}()
			s.waitStalled(t)
			target, err := s.publish(t, dir, "healthy", s.proxy.Host+"/m/model:v1")
			if err != nil {
				t.Fatalf("the healthy publish, joined to the stalled pull: %v (code %s)", err, status.Code(err))
			}
			if n := s.stalled.ExtraBytes(); n != 0 {
				t.Fatalf("the stalled registry was sent %d bytes past its requests", n)
			}
			s.wantWeights(t, target)
			drvUnpublish(t, s.d.node(), "healthy", target)
			// The stalled caller's pull completed from the healthy source, which is no proof for its own registry.
			err = <-stalledDone
			if status.Code(err) == codes.Aborted {
				stalledTarget, err = s.publish(t, dir, "stalled", s.stalled.Host+"/m/model:v1")
			}
			drvWantCode(t, err, codes.NotFound, "does not serve")
			if _, err := os.Stat(stalledTarget); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the refused stalled publish left %s behind", stalledTarget)
			}
		})
		t.Run(mode.name+"/healthy first", func(t *testing.T) {
			testenv.RequireRoot(t)
			dir := t.TempDir()
			drvCleanupMounts(t, dir)
			s := newDrvStallCase(t, dir, mode.mode)
			s.proxy.rate.Store(1 << 20) // about 4 s for the weights: the pull is under way when the stalled publish comes
			healthyDone := make(chan error, 1)
			var target string
			go func() {
				var err error
				target, err = s.publish(t, dir, "healthy", s.proxy.Host+"/m/model:v1")
				healthyDone <- err
			}()
			for s.proxy.blobGetsOf(digestOf(s.weights)) == 0 {
				select {
				case err := <-healthyDone:
					t.Fatalf("the healthy publish ended before its weights were asked for: %v", err)
				case <-time.After(10 * time.Millisecond):
				}
			}
			_, err := s.publish(t, dir, "stalled", s.stalled.Host+"/m/model:v1")
			drvWantCode(t, err, codes.NotFound, "does not serve")
			if err := <-healthyDone; err != nil {
				t.Fatalf("the healthy publish: %v (code %s)", err, status.Code(err))
			}
			if n := s.stalled.ExtraBytes(); n != 0 {
				t.Fatalf("the stalled registry was sent %d bytes past its requests", n)
			}
			if n := s.proxy.blobGetsOf(digestOf(s.weights)); n != 1 {
				t.Fatalf("the healthy registry was asked for the weights %d times, want once", n)
			}
			s.wantWeights(t, target)
			drvUnpublish(t, s.d.node(), "healthy", target)
		})
	}
}

// A tag whose registry answers the resolution and then stalls the manifest (headers, then nothing) is answered
// UNAVAILABLE within the idle limit, however long the response-header limit: it does not stay "in progress" (ABORTED)
// for the callers that share its pull. The response-header limit here is an hour, the idle limit a second.
func TestDriverStalledTagIsUnavailableWithinTheIdleLimit(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	stalled := testenv.StartStallServer(t, testenv.StallManifestBodies)
	stalled.Serve("v1", ocispec.MediaTypeImageManifest, []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}`))
	d := drvStartWith(t, filepath.Join(dir, "node"), []string{"--registry-idle-timeout", "1s", "--registry-response-timeout", "1h"}, stalled.Host)
	for _, vol := range []string{"first", "second"} {
		target := drvKubelet(t, dir, "pod-"+vol)
		err := drvPublish(d.node(), testenv.PublishRequest(vol, target, map[string]string{"reference": stalled.Host + "/m/model:v1"}), time.Minute)
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("publish %s of the stalled tag: %v, want UNAVAILABLE", vol, err)
		}
	}
	if n := stalled.ExtraBytes(); n != 0 {
		t.Fatalf("the stalled registry was sent %d bytes past its requests", n)
	}
}
