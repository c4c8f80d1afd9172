package remote

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/internal/testenv"
)

// A registry that accepts the connection and never answers, or answers a manifest's headers and then nothing, is
// given up on within the idle limit when resolving a tag or reading a manifest, however long the response-header
// limit (meant for uploads) is: a stalled tag does not stay "in progress" for minutes.
func TestStalledManifestIsBoundedByTheIdleLimit(t *testing.T) {
	tm := Timeouts{ResponseHeader: time.Hour, Idle: 200 * time.Millisecond, Attempts: 2}
	for _, mode := range []testenv.StallMode{testenv.StallAll, testenv.StallManifestBodies} {
		s := testenv.StartStallServer(t, mode)
		s.Serve("v1", ocispec.MediaTypeImageManifest, []byte(`{"schemaVersion":2}`))
		repo := repoFor(t, s.Host+"/r/model:v1", Options{PlainHTTP: true, RegistryConfig: filepath.Join(t.TempDir(), "config.json"), Timeouts: tm})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a failure guard
		if _, err := repo.Resolve(ctx, "v1"); mode == testenv.StallAll && (!errors.Is(err, ErrUnavailable) || ctx.Err() != nil) {
			t.Errorf("mode %d: resolve: %v, want ErrUnavailable before the guard", mode, err)
		}
		if _, rc, err := repo.FetchReference(ctx, "v1"); !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
			if rc != nil {
				rc.Close()
			}
			t.Errorf("mode %d: fetch: %v, want ErrUnavailable before the guard", mode, err)
		}
		cancel()
	}
}

// The signature client's reads (Transports) give up a manifest whose answer does not start within the idle
// limit, as the pull's do, however long the response-header limit is.
func TestTransportsBoundAStalledManifest(t *testing.T) {
	s := testenv.StartStallServer(t, testenv.StallAll)
	rt := transportFor(t, Options{Timeouts: Timeouts{ResponseHeader: time.Hour, Idle: 200 * time.Millisecond}}, s.Host)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a failure guard
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Host+"/v2/r/model/manifests/sha256-0.sig", nil)
	req.Header.Set("Authorization", "Basic b3JpZ2luOnNlY3JldA==")
	resp, err := rt.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	if !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
		t.Fatalf("a stalled signature manifest: %v, want ErrUnavailable before the guard", err)
	}
}
