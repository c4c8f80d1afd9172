package prepull

import (
	"context"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Backend is the node-side machinery a prepull drives: the very registry access, verifier and cache the driver
// mounts from, so a prepulled model is exactly what a later mount finds.
type Backend interface {
	// Resolve returns the manifest or index ref names now.
	Resolve(ctx context.Context, ref string) (ocispec.Descriptor, error)
	// Verify applies the node's trust policy to ref at desc, as a mount would; an error refuses the pull.
	Verify(ctx context.Context, ref string, desc ocispec.Descriptor) error
	// Pull makes the content of desc complete in the cache and returns the manifest to pin (for an index, the
	// node's platform). progress may be called from any goroutine.
	Pull(ctx context.Context, ref string, desc ocispec.Descriptor, progress func(done, total int64)) (digest.Digest, error)
	// Pin keeps manifest from eviction under name until Unpin(name); pinning the same name again is no error.
	Pin(ctx context.Context, name string, manifest digest.Digest) error
	// Unpin releases name; an unknown name is no error.
	Unpin(ctx context.Context, name string) error
	// Pins returns every pin the cache holds, by name, so pins left by an earlier run can be reconciled.
	Pins(ctx context.Context) (map[string]digest.Digest, error)
	// Cache lists what the cache holds and who holds it.
	Cache(ctx context.Context) ([]CacheEntry, error)
}

// CacheEntry is one manifest in the node cache.
type CacheEntry struct {
	Digest   digest.Digest `json:"digest"`
	Name     string        `json:"name,omitempty"`
	Size     int64         `json:"size"`
	Complete bool          `json:"complete"`
	// Owners say why the entry is kept: pins are "pin:<name>", mounted volumes name their volume.
	Owners   []string  `json:"owners,omitempty"`
	LastUsed time.Time `json:"lastUsed,omitzero"`
}
