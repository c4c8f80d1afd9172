package cache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	digest "github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"

	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/diskio"
)

// Integrity. Blobs are verified when they enter (cas), but disks and people damage files later. Three checks:
//
//   - on use, cheap: a complete manifest whose blobs are not all there with their sizes is not complete (Has,
//     Resolve, Pull and Acquire see it so), which catches truncation and deletion at the cost of a stat per blob;
//   - a full re-hash of every blob (Repair): after an unclean start (in the background, once open), every
//     Options.VerifyInterval, and on demand (modelpack cache verify --repair);
//   - after a restart of the machine, cas re-hashes the blobs whose flush had not completed before Open returns.
//
// A bad blob is quarantined (cas.Quarantine), the manifests that need it become incomplete so that the next
// publish pulls it again, and the views and extracted layers built from it are deleted. Each is counted in
// modelpack_cache_corrupt_blobs_total and logged.

// runningFile exists while a process has the cache open; finding it at Open means the last one did not Close.
const runningFile = "running"

// backgroundVerifyHook, if set (tests), receives the result of each background verification.
var backgroundVerifyHook func(VerifyReport, error)

// damage is what the cheap check found wrong with a manifest's blobs, by digest.
func (c *Cache) damage(rec *manifestRecord) map[digest.Digest]string {
	var bad map[digest.Digest]string
	for _, b := range rec.blobs() {
		n, err := c.blobs.Stat(b.Digest)
		var why string
		switch {
		case errors.Is(err, cas.ErrNotFound):
			why = "missing"
		case err != nil:
			why = err.Error()
		case n != b.Size:
			why = fmt.Sprintf("size %d, descriptor says %d", n, b.Size)
		default:
			continue
		}
		if bad == nil {
			bad = map[digest.Digest]string{}
		}
		bad[b.Digest] = why
	}
	return bad
}

// repair takes bad blobs out of use: see the comment at the top of this file.
func (c *Cache) repair(bad map[digest.Digest]string) error {
	if len(bad) == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for d, why := range bad {
		kind := "digest"
		switch {
		case strings.HasPrefix(why, "missing"):
			kind = "missing"
		case strings.HasPrefix(why, "size"):
			kind = "size"
		}
		c.m.corruptBlobs.WithLabelValues(kind).Inc()
		c.log.Error("cache blob is damaged: quarantined; the manifests that need it will be pulled again", "digest", d.String(), "problem", why)
		errs = append(errs, c.blobs.Quarantine(d))
	}
	var affected []digest.Digest
	errs = append(errs, c.db.Update(func(tx *bolt.Tx) error {
		ms, err := allManifests(tx)
		if err != nil {
			return err
		}
		for _, m := range ms {
			hit := false
			for _, b := range m.blobs() {
				if _, ok := bad[b.Digest]; ok {
					hit = true
				}
			}
			if !hit {
				continue
			}
			affected = append(affected, m.Descriptor.Digest)
			if m.Complete {
				m.Complete = false
				if err := putJSON(tx.Bucket(bucketState), string(m.Descriptor.Digest), manifestState{m.Descriptor, false, m.LastUsed}); err != nil {
					return err
				}
			}
		}
		for d := range bad {
			if err := tx.Bucket(bucketLayers).Delete([]byte(d)); err != nil {
				return err
			}
			if err := tx.Bucket(bucketDurableLayers).Delete([]byte(d)); err != nil {
				return err
			}
		}
		return nil
	}))
	for d := range bad {
		errs = append(errs, c.trash(c.layerDir(d)))
	}
	// A view holds hardlinks to the bad inode: it goes too (also from under a volume that mounts it, which would
	// otherwise keep reading wrong bytes); the next Acquire builds a new one from the fetched blobs.
	errs = append(errs, c.trashViews(affected))
	return errors.Join(errs...)
}

// trashViews deletes every view (whole or selected) of the given manifests.
func (c *Cache) trashViews(manifests []digest.Digest) error {
	views, err := os.ReadDir(filepath.Join(c.root, "views"))
	if err != nil {
		return err
	}
	var errs []error
	for _, v := range views {
		for _, m := range manifests {
			if v.Name() == m.Encoded() || strings.HasPrefix(v.Name(), m.Encoded()+"-") {
				errs = append(errs, c.trash(c.viewDir(v.Name())))
			}
		}
	}
	return errors.Join(errs...)
}

// Repair re-hashes every blob like Verify and takes the bad ones out of use: quarantined, their manifests marked
// incomplete (the next pull fetches them again), their views and extracted layers deleted.
func (c *Cache) Repair(ctx context.Context) (VerifyReport, error) {
	r, err := c.Verify(ctx)
	if err != nil {
		return r, err
	}
	bad := map[digest.Digest]string{}
	for _, p := range r.Problems {
		bad[p.Digest] = p.What
	}
	if err := c.repair(bad); err != nil {
		return r, err
	}
	for d := range bad {
		r.Repaired = append(r.Repaired, d)
	}
	sort.Slice(r.Repaired, func(i, j int) bool { return r.Repaired[i] < r.Repaired[j] })
	if err := c.emptyTrash(); err != nil {
		return r, err
	}
	return r, nil
}

// extraction is one extraction of a layer into its directory: deleted (GC, a repair) and extracted again, it is
// another, which the flush of the earlier one does not vouch for.
type extraction = cas.Version[digest.Digest]

// flushLayerLater makes an extracted layer durable in the background, together with the layers extracted close
// to it: one syncfs per batch, once the pulls have had the time to finish (cas.Flusher; at once when the cache
// closes).
func (c *Cache) flushLayerLater(e extraction) { c.layerFlusher.Add(e) }

// syncFSHook, if set (tests), runs after each syncfs of the layers' file system, before the marks it allows, with
// the cache's root.
var syncFSHook atomic.Pointer[func(root string)]

// flushLayers is the layer flusher's work. The batch was taken before the syncfs began, and an extraction joins a
// batch only once complete, so the syncfs covers every file of every layer it marks.
func (c *Cache) flushLayers(batch []extraction) {
	if err := diskio.SyncFS(filepath.Join(c.root, "layers")); err != nil {
		return // failing: unmarked, so deleted and extracted again after a restart of the machine
	}
	if hook := syncFSHook.Load(); hook != nil {
		(*hook)(c.root)
	}
	c.db.Update(func(tx *bolt.Tx) error {
		durable := tx.Bucket(bucketDurableLayers)
		for _, e := range batch {
			if err := c.extractions.Mark(e, func() error {
				if _, err := os.Lstat(c.layerDir(e.Key)); err != nil {
					return nil // gone (GC)
				}
				return durable.Put([]byte(e.Key), []byte{1})
			}); err != nil {
				return err
			}
		}
		return nil
	})
}

// maintain runs in the background while the cache is open: a full verification after an unclean start and every
// VerifyInterval, and the removal of partial downloads abandoned for longer than their linger.
func (c *Cache) maintain(unclean bool) {
	defer c.wg.Done()
	verifyFailed := func(err error) {
		if c.ctx.Err() == nil {
			c.log.Warn("cache verification failed", "error", err.Error())
		}
	}
	verify := func() {
		r, err := c.Repair(c.ctx)
		if err != nil {
			verifyFailed(err)
		}
		if backgroundVerifyHook != nil {
			backgroundVerifyHook(r, err)
		}
	}
	if unclean {
		c.log.Info("cache was not closed cleanly: verifying every blob in the background")
		if r, err := c.Repair(c.ctx); err == nil {
			c.uncleanVerified.Store(true)
			if backgroundVerifyHook != nil {
				backgroundVerifyHook(r, err)
			}
		} else {
			verifyFailed(err)
		}
	}
	var verifyTick <-chan time.Time
	if c.opts.VerifyInterval > 0 {
		t := time.NewTicker(c.opts.VerifyInterval)
		defer t.Stop()
		verifyTick = t.C
	}
	sweep := time.NewTicker(c.partialLinger())
	defer sweep.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-verifyTick:
			verify()
		case <-sweep.C:
			c.dropStalePartials(time.Now())
		}
	}
}

// partialLinger is how long a partial download may sit untouched before it counts as abandoned.
func (c *Cache) partialLinger() time.Duration {
	if c.opts.PullLinger > 0 {
		return c.opts.PullLinger
	}
	return defaultPullLinger
}

// dropStalePartials deletes partial downloads nobody has written for longer than their linger and that no ingest
// holds: those of pulls abandoned by every caller (and of processes that died), whatever the cache's size limit.
func (c *Cache) dropStalePartials(now time.Time) int {
	ages, err := c.blobs.PartialAge(now)
	if err != nil {
		return 0
	}
	n := 0
	for d, age := range ages {
		if age < c.partialLinger() {
			continue
		}
		if ok, _ := c.blobs.DropPartial(d); ok {
			n++
		}
	}
	return n
}
