package prepull

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/time/rate"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/registry"

	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/cache"
	"github.com/modelpack/modelpack/csidriver/cachebackend"
)

// ownerPrefix marks the cache references that are pins rather than mounted volumes.
const ownerPrefix = "pin:"

// ImageRecorder is where mounts look up what a reference resolved to (the CSI driver's state). Without a record
// there, a pod mounting a prepulled tag would still ask the registry what the tag points to.
type ImageRecorder interface {
	RecordImage(ref, platform string, dgst, manifest digest.Digest) error
}

// CacheBackend is the Backend of a real node: the driver's cache, registries reached with the driver's options,
// and the driver's verifier, called with the same arguments as before a mount.
type CacheBackend struct {
	cache  *cache.Cache
	opts   cachebackend.Options
	lim    *rate.Limiter
	images ImageRecorder
}

// NewCacheBackend prepulls into c and records every pull in images (nil records nothing). bytesPerSecond > 0 caps
// the registry reads of prepulls, all together; a mount that needs a model while it is being prepulled joins that
// transfer, cap included.
func NewCacheBackend(c *cache.Cache, opts cachebackend.Options, images ImageRecorder, bytesPerSecond int64) *CacheBackend {
	if opts.Remote.Hints == (remote.Hints{}) {
		opts.Remote.Hints = cachebackend.DriverHints // prepull runs beside the driver, with its flags
	}
	return &CacheBackend{cache: c, opts: opts, lim: newLimiter(bytesPerSecond), images: images}
}

func (b *CacheBackend) repository(ref string) (*remote.Repository, registry.Reference, error) {
	parsed, err := registry.ParseReference(ref)
	if err != nil {
		return nil, registry.Reference{}, fmt.Errorf("invalid reference: %w", err)
	}
	opts := b.opts.Remote
	if slices.Contains(b.opts.PlainHTTPRegistries, parsed.Registry) {
		opts.PlainHTTP = true
	}
	return remote.NewRepository(ref, opts)
}

// Resolve asks the registry (or its mirror) what ref names now.
func (b *CacheBackend) Resolve(ctx context.Context, ref string) (ocispec.Descriptor, error) {
	repo, parsed, err := b.repository(ref)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	return repo.Resolve(ctx, parsed.Reference)
}

// Verify runs the driver's verifier on the same digest reference a mount of ref would check; without one,
// every artifact is allowed, as for mounts.
func (b *CacheBackend) Verify(ctx context.Context, ref string, desc ocispec.Descriptor) error {
	if b.opts.Verifier == nil {
		return nil
	}
	parsed, err := registry.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("invalid reference: %w", err)
	}
	return b.opts.Verifier.Verify(ctx, parsed.Registry+"/"+parsed.Repository+"@"+desc.Digest.String())
}

// Pull brings desc into the cache; an index is narrowed to the node's platform, as for a mount without one.
func (b *CacheBackend) Pull(ctx context.Context, ref string, desc ocispec.Descriptor, progress func(done, total int64)) (digest.Digest, error) {
	repo, _, err := b.repository(ref)
	if err != nil {
		return "", err
	}
	var src oras.ReadOnlyTarget = repo
	if b.lim != nil {
		src = limitedTarget{ReadOnlyTarget: repo, lim: b.lim}
	}
	got, err := b.cache.Pull(ctx, src, desc, func(p cache.Progress) { progress(p.Done, p.Total) })
	if err != nil {
		return "", err
	}
	if b.images != nil {
		// Platform "": the cache narrowed an index to the node's platform, as for a mount that names none.
		if err := b.images.RecordImage(ref, "", desc.Digest, got.Digest); err != nil {
			return "", fmt.Errorf("record %s for mounts: %w", ref, err)
		}
	}
	return got.Digest, nil
}

// Pin holds the whole-model view of manifest, which keeps GC from evicting it and makes a later mount of the
// whole model find its view built.
func (b *CacheBackend) Pin(_ context.Context, name string, manifest digest.Digest) error {
	_, err := b.cache.Acquire(ownerPrefix+name, manifest, cache.Selector{})
	return err
}

// Unpin drops the pin; the model stays until GC needs the room.
func (b *CacheBackend) Unpin(_ context.Context, name string) error {
	return b.cache.Release(ownerPrefix + name)
}

// Pins reads every pin from the cache's references.
func (b *CacheBackend) Pins(context.Context) (map[string]digest.Digest, error) {
	refs, err := b.cache.Refs()
	if err != nil {
		return nil, err
	}
	pins := map[string]digest.Digest{}
	for _, r := range refs {
		if name, ok := strings.CutPrefix(r.Owner, ownerPrefix); ok {
			pins[name] = r.Manifest
		}
	}
	return pins, nil
}

// Cache lists the cache's manifests with their owners.
func (b *CacheBackend) Cache(context.Context) ([]CacheEntry, error) {
	entries, err := b.cache.List()
	if err != nil {
		return nil, err
	}
	out := make([]CacheEntry, 0, len(entries))
	for _, e := range entries {
		out = append(out, CacheEntry{Digest: e.Descriptor.Digest, Name: e.Name, Size: e.Size, Complete: e.Complete,
			Owners: e.Refs, LastUsed: e.LastUsed})
	}
	return out, nil
}
