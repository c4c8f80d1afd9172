package cache

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/artifact"
)

// Two pulls sharing a tar layer share its extraction; the one that gives up must not fail the other.
func TestCancelledExtractionDoesNotFailJoinedCallers(t *testing.T) {
	c := openCache(t, t.TempDir(), Options{})
	b := makeTar(t, false, tarEntry{Name: "a.txt", Body: "hello"})
	d := digest.FromBytes(b)
	// The blob is a fifo, so the extraction waits until the test feeds it.
	blob := c.blobs.Path(d)
	if err := syscall.Mkfifo(blob, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Release a writer still waiting for a reader.
		if f, err := os.OpenFile(blob, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	l := artifact.Layer{Descriptor: ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: d, Size: int64(len(b))}, Format: artifact.FormatTar}

	// The extraction cannot finish before the fifo is fed, so a caller registered while it runs has joined it.
	registered := make(chan struct{}, 8)
	set(t, &c.hooks.layerFlight, func(digest.Digest) {
		select {
		case registered <- struct{}{}:
		default: // retries after the test stopped listening
		}
	})
	ctxA, cancelA := context.WithCancel(context.Background())
	errA := make(chan error, 1)
	go func() { errA <- c.ensureLayer(ctxA, l) }()
	<-registered // A leads
	errB := make(chan error, 1)
	go func() { errB <- c.ensureLayer(context.Background(), l) }()
	<-registered // B joined A's extraction
	cancelA()
	done := make(chan struct{})
	defer close(done)
	go func() {
		for { // for A's attempt, then for any retry
			select {
			case <-done:
				return
			default:
			}
			f, err := os.OpenFile(blob, os.O_WRONLY, 0)
			if err != nil {
				return
			}
			f.Write(b)
			f.Close()
		}
	}()
	if err := <-errA; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v", err)
	}
	select {
	case err := <-errB:
		if err != nil {
			t.Fatalf("a caller that was not cancelled failed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("extraction did not finish")
	}
	if got, err := os.ReadFile(filepath.Join(c.layerDir(d), "a.txt")); err != nil || string(got) != "hello" {
		t.Fatalf("extracted layer: %q %v", got, err)
	}
}
