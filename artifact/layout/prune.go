package layout

import (
	"context"
	"fmt"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// PruneStats says what Prune removed.
type PruneStats struct {
	Blobs int   `json:"blobs"`
	Bytes int64 `json:"bytes"`
}

// Prune deletes every blob no tag reaches: what rm untagged, and what interrupted packs and pulls left. Manifests
// recorded untagged because they refer to a subject (signatures) are kept while their subject is. Prune waits for
// other processes writing to the store to finish (until ctx ends); any writes this Store made must already be
// tagged.
func (s *Store) Prune(ctx context.Context) (PruneStats, error) {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	// Taking the lock exclusively converts a shared lock this Store holds; Unlock below releases it entirely.
	if _, err := s.gc.TryLockContext(ctx, lockRetry); err != nil {
		return PruneStats{}, fmt.Errorf("wait for other writers to %s: %w", s.root, err)
	}
	defer func() {
		s.gc.Unlock()
		s.gcShared = false
	}()

	idx, err := s.readIndex()
	if err != nil {
		return PruneStats{}, err
	}
	live := map[digest.Digest]bool{}
	var mark func(d ocispec.Descriptor) error
	mark = func(d ocispec.Descriptor) error {
		if live[d.Digest] {
			return nil
		}
		live[d.Digest] = true
		if !isManifest(d.MediaType) {
			return nil
		}
		m, err := s.readManifest(d)
		if err != nil {
			return fmt.Errorf("read %s: %w", d.Digest, err)
		}
		for _, c := range m.children() {
			if err := mark(c); err != nil {
				return err
			}
		}
		return nil
	}
	var referrers []ocispec.Descriptor
	for _, d := range idx.Manifests {
		if d.Annotations[ocispec.AnnotationRefName] != "" {
			if err := mark(d); err != nil {
				return PruneStats{}, err
			}
		} else {
			referrers = append(referrers, d)
		}
	}
	// A referrer lives while its subject does; a referrer can itself be a subject, so repeat until nothing changes.
	subjects := map[digest.Digest]digest.Digest{}
	for _, d := range referrers {
		if m, err := s.readManifest(d); err == nil && m.Subject != nil {
			subjects[d.Digest] = m.Subject.Digest
		}
	}
	for changed := true; changed; {
		changed = false
		for _, d := range referrers {
			if !live[d.Digest] && live[subjects[d.Digest]] {
				if err := mark(d); err != nil {
					return PruneStats{}, err
				}
				changed = true
			}
		}
	}
	if err := s.updateIndex(func(idx *ocispec.Index) error {
		keep := idx.Manifests[:0]
		for _, d := range idx.Manifests {
			if live[d.Digest] {
				keep = append(keep, d)
			}
		}
		idx.Manifests = keep
		return nil
	}); err != nil {
		return PruneStats{}, err
	}

	var stats PruneStats
	err = s.blobs.Walk(func(d digest.Digest, size int64) error {
		if live[d] {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.blobs.Delete(d); err != nil {
			return err
		}
		stats.Blobs++
		stats.Bytes += size
		return nil
	})
	if err != nil {
		return stats, err
	}
	// No other process writes now, so the temporaries of interrupted writes, partial downloads and their locks can
	// go too.
	if _, err := s.blobs.DropIngests(); err != nil {
		return stats, err
	}
	return stats, s.blobs.Recover()
}
