package cache

import (
	"context"
	"fmt"
	"sync"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sync/errgroup"
	"oras.land/oras-go/v2"
)

// A digest names bytes, not a right to read them: anyone may know the digests of a private model (a gated Hub
// model's LFS oids are its sha256s) and list them in a manifest of their own. So the cache hands a caller content
// it already holds only once the caller's own source has shown it serves that content, as a registry mounts a blob
// across repositories only for a caller who may read the source: each blob the caller's source did not itself
// deliver, whole, in this pull is asked for there (a HEAD, with the caller's credentials).

// Prove asks src whether it serves every part of the content of manifest, chosen from top (the manifest itself,
// or the index it came from), that the cache holds: top, the manifest, its config and each layer, none fetched. It
// returns an error wrapping ErrNotFound naming the first part src does not serve, or src's own error (a refusal,
// an outage).
func (c *Cache) Prove(ctx context.Context, src oras.ReadOnlyTarget, top, manifest digest.Digest) error {
	rec, ok := c.completeRecord(manifest)
	if !ok {
		return fmt.Errorf("%s: %w", manifest, ErrNotFound)
	}
	desc := rec.Descriptor
	switch {
	case top == manifest:
	case rec.From != nil && rec.From.Digest == top:
		desc = *rec.From
	default: // an index whose entry for a named platform was pulled as itself
		desc = ocispec.Descriptor{MediaType: ocispec.MediaTypeImageIndex, Digest: top}
	}
	return c.prove(ctx, src, desc, rec, nil)
}

// prove is Prove for the record rec of desc, skipping the parts delivered reports src delivered in this pull.
func (c *Cache) prove(ctx context.Context, src oras.ReadOnlyTarget, desc ocispec.Descriptor, rec *manifestRecord, delivered func(digest.Digest) bool) error {
	seen := map[digest.Digest]bool{}
	var parts []ocispec.Descriptor
	add := func(what string, d ocispec.Descriptor) {
		if d.Digest == "" || seen[d.Digest] || (delivered != nil && delivered(d.Digest)) {
			return
		}
		seen[d.Digest] = true
		if d.MediaType == "" {
			d.MediaType = what
		}
		parts = append(parts, d)
	}
	top := ocispec.Descriptor{MediaType: desc.MediaType, Digest: desc.Digest, Size: desc.Size}
	if top.MediaType == "" && rec.From != nil && rec.From.Digest == desc.Digest {
		top.MediaType = rec.From.MediaType
	}
	add(ocispec.MediaTypeImageManifest, top)
	add(ocispec.MediaTypeImageManifest, rec.Descriptor)
	add("application/octet-stream", rec.Config)
	for _, l := range rec.Layers {
		add("application/octet-stream", l.Descriptor)
	}
	if len(parts) == 0 {
		return nil
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(c.opts.Concurrency)
	for _, d := range parts {
		g.Go(func() error {
			ok, err := src.Exists(gctx, d)
			if err != nil {
				return fmt.Errorf("ask the source whether it serves %s (%s), which this node holds: %w", d.Digest, d.MediaType, err)
			}
			if !ok {
				c.m.pulls.WithLabelValues("unproven").Inc()
				return fmt.Errorf("%w: the source does not serve %s (%s) of %s; this node holds those bytes, but shares them only with callers whose source serves them", ErrNotFound, d.Digest, d.MediaType, desc.Digest)
			}
			return nil
		})
	}
	return g.Wait()
}

// A source that reads through mirrors (remote.Repository with a hosts.toml) may be served what its caller may not
// read: a mirror answers with its own credentials (a P2P agent or a pull-through cache reads the origin with the
// fleet's). Only the origin speaks for the caller: what a mirror delivered is asked of the origin (a HEAD) like
// content the cache already held, and a cold pull first asks the origin whether it serves the manifest at all, so
// a caller it refuses never makes the node pull through a mirror.
type mirroredSource interface {
	Mirrored() bool
	FromOrigin(d digest.Digest) bool
}

// askOrigin asks src's origin whether it serves desc to src's caller, when src reads through mirrors.
func askOrigin(ctx context.Context, src oras.ReadOnlyTarget, desc ocispec.Descriptor) error {
	if m, ok := src.(mirroredSource); !ok || !m.Mirrored() {
		return nil
	}
	ok, err := src.Exists(ctx, desc)
	if err != nil {
		return fmt.Errorf("ask the registry whether it serves %s before pulling it through a mirror: %w", desc.Digest, err)
	}
	if !ok {
		return fmt.Errorf("%w: the registry does not serve %s (a mirror's copy is not read for callers the registry does not serve)", ErrNotFound, desc.Digest)
	}
	return nil
}

// deliveredBy reports whether source i of the set delivered blob d, from its first byte, in this pull, from its
// origin (see mirroredSource).
func (s *sourceSet) deliveredBy(i int) func(digest.Digest) bool {
	return func(d digest.Digest) bool {
		s.mu.Lock()
		got, ok := s.served[d]
		src := s.list[i]
		s.mu.Unlock()
		if m, viaMirrors := src.(mirroredSource); viaMirrors && !m.FromOrigin(d) {
			return false
		}
		return ok && got.i == i && got.start == 0
	}
}

// proveFlight is prove for a caller of flight f whose source is src, source own of the flight (-1 if none). It
// reads the flight's record: GC may have evicted the content since (nothing holds it yet), which the caller finds
// when it acquires or holds it, and then pulls again.
func (c *Cache) proveFlight(ctx context.Context, f *flight, own int, src oras.ReadOnlyTarget, desc ocispec.Descriptor) error {
	var delivered func(digest.Digest) bool
	if own >= 0 {
		delivered = f.src.deliveredBy(own)
	}
	return c.prove(ctx, src, desc, f.rec, delivered)
}

// Hold keeps the complete manifest d (or the manifest the index d chose) from GC until release is called, for a
// caller between finding content and acquiring a view of it: a publish that found a model, checked who may read
// it and verified it must not find it evicted when it mounts. It returns the manifest held, or ErrNotFound when d
// is not complete in the cache (pull it, again). release may be called more than once.
func (c *Cache) Hold(d digest.Digest) (manifest digest.Digest, release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	err = c.db.View(func(tx *bolt.Tx) error {
		md, err := resolveDigest(tx, d)
		if err != nil {
			return err
		}
		st, ok, err := stateOf(tx, md)
		if err != nil {
			return err
		}
		if !ok || !st.Complete {
			return fmt.Errorf("manifest %s: %w (pull it first)", d, ErrNotFound)
		}
		manifest = md
		return nil
	})
	if err != nil {
		return "", nil, err
	}
	c.held[manifest]++
	var once sync.Once
	return manifest, func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.held[manifest]--; c.held[manifest] <= 0 {
				delete(c.held, manifest)
			}
		})
	}, nil
}
