package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/internal/testenv"
)

func hostileRepo(t *testing.T, h *testenv.HostileRegistry, tm Timeouts) *Repository {
	t.Helper()
	return repoFor(t, h.Host+"/r/model:v1", Options{PlainHTTP: true, RegistryConfig: filepath.Join(t.TempDir(), "config.json"), Timeouts: tm})
}

// A blob whose size is not its descriptor's fails on the first GET with ErrSizeMismatch: no retries, no resume
// loop, whether the registry declares the size (Content-Length) or streams it (chunked), short or long.
func TestBlobOfTheWrongSizeFailsAtOnce(t *testing.T) {
	content := []byte(strings.Repeat("weights!", 512))
	chunked := func(w http.ResponseWriter, _ *http.Request, _ digest.Digest, b []byte) bool {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush() // no Content-Length: the body is chunked
		w.Write(b)
		return true
	}
	for _, tc := range []struct {
		name  string
		delta int64
		serve func(http.ResponseWriter, *http.Request, digest.Digest, []byte) bool
	}{
		{"declared, descriptor larger", +100, nil},
		{"declared, descriptor smaller", -100, nil},
		{"chunked, descriptor larger", +100, chunked},
		{"chunked, descriptor smaller", -100, chunked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := testenv.StartHostileRegistry(t)
			h.OnBlob = tc.serve
			desc := h.Blob("application/octet-stream", content)
			desc.Size += tc.delta
			repo := hostileRepo(t, h, Timeouts{})
			rc, err := repo.Fetch(context.Background(), desc)
			if err == nil {
				_, err = io.ReadAll(rc)
				rc.Close()
			}
			if !errors.Is(err, ErrSizeMismatch) || Classify(err) != ErrSizeMismatch {
				t.Fatalf("got %v (class %v), want ErrSizeMismatch", err, Classify(err))
			}
			if retryable(err) {
				t.Errorf("%v is retryable", err)
			}
			if n := h.Gets(desc.Digest); n != 1 {
				t.Errorf("%d GETs of the blob, want 1: a lying size was retried", n)
			}
			var re *Error
			if errors.As(repo.wrap("blob", err), &re) && !strings.Contains(re.Error(), "retrying cannot help") {
				t.Errorf("message %q does not say retrying cannot help", re.Error())
			}
		})
	}
}

// A registry that accepts a blob GET and then says nothing (no headers, or a few bytes and silence) fails the
// read after Attempts attempts with ErrUnavailable, instead of holding it forever.
func TestStallingRegistryGivesUpWithAClearError(t *testing.T) {
	tm := Timeouts{ResponseHeader: 200 * time.Millisecond, Idle: 200 * time.Millisecond, Attempts: 3}
	content := []byte(strings.Repeat("x", 64<<10))
	for _, tc := range []struct {
		name     string
		serve    func(http.ResponseWriter, *http.Request, digest.Digest, []byte) bool
		wantGets int
	}{
		{"no response headers", func(w http.ResponseWriter, r *http.Request, _ digest.Digest, _ []byte) bool {
			<-r.Context().Done() // until the client gives up
			return true
		}, 3},
		{"body stops after some bytes", func(w http.ResponseWriter, r *http.Request, _ digest.Digest, b []byte) bool {
			if r.Header.Get("Range") == "" {
				w.Header().Set("Content-Length", "65536")
				w.WriteHeader(http.StatusOK)
				w.Write(b[:1000])
				w.(http.Flusher).Flush()
			}
			<-r.Context().Done()
			return true
		}, 1 + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := testenv.StartHostileRegistry(t)
			h.OnBlob = tc.serve
			desc := h.Blob("application/octet-stream", content)
			rc, err := hostileRepo(t, h, tm).Fetch(context.Background(), desc)
			if err == nil {
				_, err = io.ReadAll(rc)
				rc.Close()
			}
			if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "gave up after 3 attempts") {
				t.Fatalf("got %v, want ErrUnavailable after 3 attempts", err)
			}
			if n := h.Gets(desc.Digest); n != tc.wantGets {
				t.Errorf("%d GETs of the blob, want %d", n, tc.wantGets)
			}
		})
	}
}

// fetch takes the only manifest of a platform-less index, as the node cache (the driver) does: both use
// artifact.ChoosePlatform.
func TestFetchAgreesWithTheDriverOnAPlatformlessIndex(t *testing.T) {
	h := testenv.StartHostileRegistry(t)
	data := []byte("tokenizer")
	layer := h.Blob(artifact.LayerMediaType(artifact.KindWeightConfig, artifact.FormatRaw), data)
	layer.Annotations = map[string]string{artifact.AnnotationFilepath: "tokenizer.json"}
	cfg := h.Blob(artifact.MediaTypeModelConfig, []byte(`{"descriptor":{},"modelfs":{"type":"layers","diffIds":["`+layer.Digest.String()+`"]},"config":{}}`))
	m := ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		ArtifactType: artifact.ArtifactTypeModelManifest, Config: cfg, Layers: []ocispec.Descriptor{layer}}
	md := h.Manifest(t, "", m, ocispec.MediaTypeImageManifest)
	h.Manifest(t, "v1", ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{md}}, ocispec.MediaTypeImageIndex)
	dir := t.TempDir()
	if _, err := Fetch(context.Background(), hostileRepo(t, h, Timeouts{}), dir, FetchOptions{}); err != nil {
		t.Fatalf("fetch of a one-entry index without platforms: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "tokenizer.json")); err != nil || string(b) != string(data) {
		t.Fatalf("tokenizer.json = %q, %v", b, err)
	}
}

// A registry that sends a manifest's headers and then nothing fails the read within the timeouts.
func TestStalledManifestBodyFails(t *testing.T) {
	h := testenv.StartHostileRegistry(t)
	desc := h.Manifest(t, "v1", ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest}, ocispec.MediaTypeImageManifest)
	h.OnManifest = func(w http.ResponseWriter, r *http.Request, _ string, b []byte) bool {
		w.Header().Set("Content-Type", ocispec.MediaTypeImageManifest)
		w.Header().Set("Docker-Content-Digest", digest.FromBytes(b).String())
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.WriteHeader(http.StatusOK)
		w.Write(b[:len(b)/2])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return true
	}
	repo := hostileRepo(t, h, Timeouts{ResponseHeader: 100 * time.Millisecond, Idle: 100 * time.Millisecond})
	for name, read := range map[string]func() error{
		"by descriptor": func() error {
			rc, err := repo.Fetch(context.Background(), desc)
			if err == nil {
				_, err = io.ReadAll(rc)
			}
			return err
		},
		"by tag": func() error {
			_, rc, err := repo.FetchReference(context.Background(), "v1")
			if err == nil {
				_, err = io.ReadAll(rc)
			}
			return err
		},
	} {
		if err := read(); !errors.Is(err, ErrUnavailable) {
			t.Errorf("%s: got %v, want ErrUnavailable", name, err)
		}
	}
}
