package cache

import (
	"sync"

	digest "github.com/opencontainers/go-digest"
)

// reaper is the GC's part of the blob store: what a collection decided, under the index lock (Cache.mu), to
// delete, and the deletions themselves, which run outside that lock so that a publish or a pull recording itself
// never waits behind thousands of unlinks.
//
// The race it closes: a collection decides that no manifest needs blob X and releases the index lock; a pull then
// records a manifest that needs X, finds X present and fetches nothing. Were X unlinked after that, the pull would
// complete a manifest whose blob is gone. So every digest decided on is doomed first, under the index lock; a pull
// records its manifest under the same lock and spares its blobs (beginPull); and a deletion runs only for a digest
// still doomed, with the check and the unlink under r.mu. After spare returns, each blob spared is either still on
// disk for good or was already deleted, which the pull then sees (cas.Exists) and fetches again.
//
// Hold and Acquire need no sparing: they take only manifests whose records are complete after the collection's
// commit, and a collection dooms nothing such a manifest needs.
type reaper struct {
	// run admits one collection at a time: one's deletions never overlap another's decision.
	run sync.Mutex
	// mu guards doomed; it is held across one check and its deletion, never across two.
	mu     sync.Mutex
	doomed map[digest.Digest]bool
	// spared are the doomed digests a pull needed again during this collection.
	spared map[digest.Digest]bool
	// at, if set (tests), runs before each deletion is checked, with the digest: a gate between decision and unlink.
	at func(d digest.Digest)
}

// doom marks what a collection decided to delete. Called with the index lock held, before it is released.
func (r *reaper) doom(ds map[digest.Digest]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.doomed, r.spared = map[digest.Digest]bool{}, map[digest.Digest]bool{}
	for d := range ds {
		r.doomed[d] = true
	}
}

// spare takes ds out of the collection under way: none is deleted from now on. Called with the index lock held,
// by whatever is about to need ds (a pull recording its manifest).
func (r *reaper) spare(ds ...digest.Digest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range ds {
		if r.doomed[d] {
			delete(r.doomed, d)
			r.spared[d] = true
		}
	}
}

// reap runs del for d if d is still doomed, and reports whether it ran.
func (r *reaper) reap(d digest.Digest, del func() error) (bool, error) {
	if r.at != nil {
		r.at(d)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.doomed[d] {
		return false, nil
	}
	return true, del()
}

// done ends the collection: it returns the digests spared during it and forgets both sets.
func (r *reaper) done() map[digest.Digest]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	spared := r.spared
	r.doomed, r.spared = nil, nil
	return spared
}
