package cachebackend

import (
	"context"
	"fmt"
	"strings"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/time/rate"

	"github.com/modelpack/modelpack/cache"
	"github.com/modelpack/modelpack/csidriver"
	"github.com/modelpack/modelpack/prepull"
)

// pinPrefix marks the cache references that are prepull pins rather than mounted volumes.
const pinPrefix = "pin:"

// ImageRecorder is where mounts look up what a reference resolved to (the CSI driver's state). Without a record
// there, a pod mounting a prepulled tag would still ask the registry what the tag points to.
type ImageRecorder interface {
	RecordImage(ref, platform string, dgst, manifest digest.Digest) error
}

// Prepuller is the prepull.Backend of a node: the backend's registries, verifier and cache, with the node's own
// credentials, so a prepulled model is exactly what a later mount finds, and with the prepulls' registry reads
// capped.
type Prepuller struct {
	b      *Backend
	lim    *rate.Limiter
	images ImageRecorder
}

var _ prepull.Backend = (*Prepuller)(nil)

// Prepuller records every pull in images (nil records nothing). bytesPerSecond > 0 caps the registry reads of
// prepulls, all together; a mount that needs a model while it is being prepulled joins that transfer, cap included.
func (b *Backend) Prepuller(images ImageRecorder, bytesPerSecond int64) *Prepuller {
	return &Prepuller{b: b, lim: newLimiter(bytesPerSecond), images: images}
}

// Resolve asks the registry (or its mirror) what ref names now.
func (p *Prepuller) Resolve(ctx context.Context, ref string) (ocispec.Descriptor, error) {
	repo, parsed, err := p.b.repository(ref, csidriver.Credentials{})
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc, err := repo.Resolve(ctx, parsed.Reference)
	return desc, classify(err)
}

// Verify runs the driver's verifier on the digest reference a mount of ref would check.
func (p *Prepuller) Verify(ctx context.Context, ref string, desc ocispec.Descriptor) error {
	return p.b.Verify(ctx, ref, desc.Digest, csidriver.Credentials{})
}

// Pull brings desc into the cache; an index is narrowed to the node's platform, as for a mount without one.
func (p *Prepuller) Pull(ctx context.Context, ref string, desc ocispec.Descriptor, progress func(done, total int64)) (digest.Digest, error) {
	repo, _, err := p.b.repository(ref, csidriver.Credentials{})
	if err != nil {
		return "", err
	}
	got, err := p.b.pull(ctx, repo, desc, csidriver.Credentials{}, p.lim, func(c cache.Progress) { progress(c.Done, c.Total) })
	if err != nil {
		return "", err
	}
	// Prepulls obey the scan policy as mounts do: a model no pod may mount is not prepared for one. Its verified
	// blobs stay cached (GC takes them), its report with them.
	if err := p.b.Screen(ctx, ref, desc.Digest, got); err != nil {
		return "", err
	}
	if p.images != nil {
		// Platform "": the cache narrowed an index to the node's platform, as for a mount that names none.
		if err := p.images.RecordImage(ref, "", desc.Digest, got); err != nil {
			return "", fmt.Errorf("record %s for mounts: %w", ref, err)
		}
	}
	return got, nil
}

// Pin holds the whole-model view of manifest, which keeps GC from evicting it and makes a later mount of the
// whole model find its view built.
func (p *Prepuller) Pin(_ context.Context, name string, manifest digest.Digest) error {
	_, err := p.b.cache.Acquire(pinPrefix+name, manifest, cache.Selector{})
	return err
}

// Unpin drops the pin; the model stays until GC needs the room.
func (p *Prepuller) Unpin(_ context.Context, name string) error {
	return p.b.cache.Release(pinPrefix + name)
}

// Pins reads every pin from the cache's references.
func (p *Prepuller) Pins(context.Context) (map[string]digest.Digest, error) {
	refs, err := p.b.refs(pinPrefix)
	if err != nil {
		return nil, err
	}
	pins := map[string]digest.Digest{}
	for _, r := range refs {
		pins[strings.TrimPrefix(r.Owner, pinPrefix)] = r.Manifest
	}
	return pins, nil
}

// Cache lists the cache's manifests with their owners.
func (p *Prepuller) Cache(context.Context) ([]prepull.CacheEntry, error) {
	entries, err := p.b.cache.List()
	if err != nil {
		return nil, err
	}
	out := make([]prepull.CacheEntry, 0, len(entries))
	for _, e := range entries {
		out = append(out, prepull.CacheEntry{Digest: e.Descriptor.Digest, Name: e.Name, Size: e.Size, Complete: e.Complete,
			Owners: e.Refs, LastUsed: e.LastUsed})
	}
	return out, nil
}
