package cache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/time/rate"

	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/diskio"
)

// Integrity. Blobs are verified when they enter (cas), but disks and people damage files later. Four checks:
//
//   - on use, cheap: every blob of a manifest is stat'ed on every Has, Resolve, Pull and Acquire. A missing blob or
//     one of the wrong size makes the manifest incomplete; a blob whose stat no longer matches the stamp recorded
//     when its bytes were last verified (cas.Store.Check: inode, size, mtime, ctime) is re-hashed first, whatever
//     the number of restarts since;
//   - after an unclean start every blob is suspect (cas.Store.SuspectAll): a use re-hashes the blob it needs, or
//     waits for the re-hash under way, before passing it, while the scrub goes through the rest;
//   - the scrub re-hashes every blob in the background, at idle I/O priority, nice 19 and at most
//     Options.ScrubRate, after an unclean start and every Options.VerifyInterval, for what a stamp cannot see
//     (bit rot, writes to the block device); Repair (modelpack cache verify --repair) does it at once at full speed;
//   - after a restart of the machine, cas re-hashes the blobs whose flush had not completed before Open returns.
//
// A bad blob is quarantined (cas.Quarantine), the manifests that need it become incomplete so that the next
// publish pulls it again, and the views and extracted layers built from it are deleted. Each is counted in
// modelpack_cache_corrupt_blobs_total and logged.

// runningFile exists while a process has the cache open; finding it at Open means the last one did not Close.
const runningFile = "running"

// damage is what the check on use found wrong with a manifest's blobs, by digest. It re-hashes the blobs whose
// stamp changed or whose re-hash is pending, so it runs outside any transaction.
func (c *Cache) damage(rec *manifestRecord) map[digest.Digest]string {
	var bad map[digest.Digest]string
	for _, b := range rec.blobs() {
		// A stat compared with the blob's stamp; a re-hash only if it changed (or is pending).
		n, err := c.blobs.Check(b.Digest)
		var why string
		switch {
		case errors.Is(err, cas.ErrNotFound):
			why = "missing"
		case errors.Is(err, cas.ErrSizeMismatch), err == nil && n != b.Size:
			why = fmt.Sprintf("size %d, descriptor says %d", n, b.Size)
		case err != nil:
			why = "digest: " + err.Error()
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
		if _, err := c.blobs.Stat(d); kind != "missing" && errors.Is(err, cas.ErrNotFound) {
			continue // already out: a use and the scrub shared the re-hash that found it, and the other took it out
		}
		c.corrupt(d, kind, why)
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
			if err := deleteLayerRecords(tx, d); err != nil {
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

// corrupt counts and logs a damaged blob.
func (c *Cache) corrupt(d digest.Digest, kind, why string) {
	c.m.corruptBlobs.WithLabelValues(kind).Inc()
	c.log.Error("cache blob is damaged: quarantined; the manifests that need it will be pulled again", "digest", d.String(), "problem", why)
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

// logFlush returns the phase record of a background flush (debug): e2e/cluster/bench places it beside the pods
// started meanwhile.
func (c *Cache) logFlush(what string) func(int, time.Time, time.Duration) {
	return func(items int, start time.Time, took time.Duration) {
		c.log.Debug("phase", "phase", "flush", "what", what, "items", items, "start", start, "duration", took)
	}
}

// flushLayers is the layer flusher's work. The batch was taken before the syncfs began, and an extraction joins a
// batch only once complete, so the syncfs covers every file of every layer it marks.
func (c *Cache) flushLayers(batch []extraction) {
	if err := diskio.SyncFS(filepath.Join(c.root, "layers")); err != nil {
		return // failing: unmarked, so deleted and extracted again after a restart of the machine
	}
	run(&c.hooks.syncFS, func(f func(string)) { f(c.root) })
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

// maintain runs in the background while the cache is open: a scrub after an unclean start and every
// VerifyInterval, and the removal of partial downloads abandoned for longer than their linger.
func (c *Cache) maintain(unclean bool) {
	defer c.wg.Done()
	scrub := func() {
		r, err := c.scrub(c.ctx)
		if err != nil && c.ctx.Err() == nil {
			c.log.Warn("cache scrub failed", "error", err.Error())
		}
		if err == nil && unclean {
			c.uncleanVerified.Store(true)
		}
		run(&c.hooks.backgroundVerify, func(f func(VerifyReport, error)) { f(r, err) })
	}
	if unclean {
		c.log.Info("cache was not closed cleanly: every blob is re-hashed before its next use, and scrubbed in the background")
		scrub()
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
			scrub()
		case <-sweep.C:
			c.dropStalePartials(time.Now())
		}
	}
}

// scrub re-hashes every blob in the background and takes the bad ones out of use (see the top of this file). It
// runs on a thread of its own at idle I/O priority and nice 19, paced to ScrubRate; a use that needs a blob the
// scrub is re-hashing waits for that one blob, which is then hashed without pacing.
func (c *Cache) scrub(ctx context.Context) (VerifyReport, error) {
	type result struct {
		r   VerifyReport
		err error
	}
	out := make(chan result, 1)
	go func() {
		// The thread's priorities go with it: never unlocked, it ends with this goroutine.
		runtime.LockOSThread()
		err := diskio.Background()
		run(&c.hooks.scrub, func(f func(error)) { f(err) })
		if err != nil {
			c.log.Warn("cache scrub runs at normal priority", "error", err.Error())
		}
		r, err := c.scrubBlobs(ctx)
		out <- result{r, err}
	}()
	res := <-out
	return res.r, res.err
}

func (c *Cache) scrubBlobs(ctx context.Context) (VerifyReport, error) {
	var r VerifyReport
	all, total, err := c.allBlobs()
	if err != nil {
		return r, err
	}
	c.m.scrubPassBytes.Set(float64(total))
	c.m.scrubPassDone.Set(0)
	defer c.m.scrubPassBytes.Set(0)
	limit := rate.NewLimiter(rate.Inf, 0)
	if c.opts.ScrubRate > 0 {
		limit = rate.NewLimiter(rate.Limit(c.opts.ScrubRate), scrubBurst)
	}
	pace := func(n int, urgent <-chan struct{}) error {
		c.m.scrubBytes.Add(float64(n))
		c.m.scrubPassDone.Add(float64(n))
		delay := limit.ReserveN(time.Now(), n).Delay()
		if delay <= 0 {
			return ctx.Err()
		}
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-urgent: // a use waits for this blob
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}
	for _, b := range all {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		err := c.blobs.Scrub(b.d, pace)
		switch {
		case err == nil, errors.Is(err, cas.ErrNotFound): // deleted meanwhile (GC)
		case ctx.Err() != nil:
			return r, ctx.Err()
		default:
			r.Problems = append(r.Problems, Problem{b.d, "digest: " + err.Error()})
			c.m.scrubCorrupt.Inc()
			if err := c.repair(map[digest.Digest]string{b.d: "digest: " + err.Error()}); err != nil {
				return r, err
			}
			r.Repaired = append(r.Repaired, b.d)
		}
		r.Blobs++
		r.Bytes += b.size
	}
	c.m.scrubLastCompletion.SetToCurrentTime()
	return r, c.emptyTrash()
}

// blobRef is a blob of the store and its size.
type blobRef struct {
	d    digest.Digest
	size int64
}

// allBlobs lists the store's blobs and their total size, for a pass over all of them (Verify, the scrub).
func (c *Cache) allBlobs() ([]blobRef, int64, error) {
	var all []blobRef
	var total int64
	err := c.blobs.Walk(func(d digest.Digest, size int64) error {
		all = append(all, blobRef{d, size})
		total += size
		return nil
	})
	return all, total, err
}

// scrubBurst is the scrub's pacing granule: more than one read of cas's (256 KiB).
const scrubBurst = 1 << 20

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
