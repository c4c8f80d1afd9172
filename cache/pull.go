package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sync/errgroup"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/errdef"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/archive"
	"github.com/modelpack/modelpack/cas"
)

// Progress reports a pull: Total bytes of the manifest's blobs and how many are in the cache so far.
type Progress struct {
	Total int64 `json:"total"`
	Done  int64 `json:"done"`
}

// flightKey names a pull: a digest, and the platform a caller named for an index ("" for the node's).
type flightKey struct {
	digest   digest.Digest
	platform string
}

// flight is one pull in progress, shared by every caller that asks for the same digest and platform.
type flight struct {
	ctx    context.Context
	done   chan struct{}
	result ocispec.Descriptor
	rec    *manifestRecord // what the pull recorded, for its callers' proofs (set with result)
	err    error
	cancel context.CancelFunc
	src    *sourceSet // the sources of every caller, so one that stalls or fails hands over to the next

	mu      sync.Mutex
	pubMu   sync.Mutex // callbacks run one at a time, never after their Pull returned
	nextID  int
	subs    map[int]func(Progress)
	linger  *time.Timer
	total   atomic.Int64
	present atomic.Int64   // bytes already in the cache when the pull began, plus finished blobs
	running []atomic.Int64 // bytes of each blob being fetched
	lastPub atomic.Int64
}

func (f *flight) progress() Progress {
	p := Progress{Total: f.total.Load(), Done: f.present.Load()}
	for i := range f.running {
		p.Done += f.running[i].Load()
	}
	return p
}

// publish calls the subscribers, at most about every 64 KiB of progress (and always when forced).
func (f *flight) publish(force bool) {
	p := f.progress()
	if !force && p.Done-f.lastPub.Load() < 64<<10 {
		return
	}
	f.pubMu.Lock()
	defer f.pubMu.Unlock()
	f.lastPub.Store(p.Done)
	p = f.progress()
	f.mu.Lock()
	subs := make([]func(Progress), 0, len(f.subs))
	for _, s := range f.subs {
		subs = append(subs, s)
	}
	f.mu.Unlock()
	for _, s := range subs {
		s(p)
	}
}

// Pull brings the manifest or index desc from src into the cache and returns the manifest descriptor chosen for this
// node. Every blob's size and digest is checked; tar layers are extracted; nothing is fetched twice. A Pull of a
// digest already being pulled joins that pull and offers it src: each read of the pull is then served by whichever
// source delivers (see raceReader), so a caller never waits on a stalled source it did not name, and a pull every
// source failed returns src's own failure. When ctx ends, Pull returns but the transfer goes on for
// Options.PullLinger so that a retry can join it. progress (may be nil) is called from the transfer, one call at a
// time and never after Pull returned; it must not block.
//
// An index is narrowed to Options.Platform, or to desc.Platform when the caller names one (a volume's platform
// attribute): the index is then fetched once, here, and the cache keeps no record of it, since the cache's answer
// for an index (Resolve) is the node's platform.
func (c *Cache) Pull(ctx context.Context, src oras.ReadOnlyTarget, desc ocispec.Descriptor, progress func(Progress)) (ocispec.Descriptor, error) {
	if err := checkDescriptor(desc); err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := artifact.CheckSize("manifest", desc); err != nil {
		return ocispec.Descriptor{}, err
	}
	// For a named platform only a manifest pulled as itself counts: an index's record is the node's platform's.
	if rec, ok := c.completeRecord(desc.Digest); ok && (desc.Platform == nil || rec.Descriptor.Digest == desc.Digest) {
		if err := c.prove(ctx, src, desc, rec, nil); err != nil {
			return ocispec.Descriptor{}, err
		}
		c.m.pulls.WithLabelValues("cached").Inc()
		c.touch(rec.Descriptor.Digest)
		return rec.Descriptor, nil
	}
	if err := askOrigin(ctx, src, desc); err != nil {
		return ocispec.Descriptor{}, err
	}
	for round := 0; ; round++ {
		f, own, id := c.joinFlight(desc, src, progress)
		select {
		case <-f.done:
		case <-ctx.Done():
			f.leave(id, c.opts.PullLinger)
			return ocispec.Descriptor{}, fmt.Errorf("pull %s: %w (the transfer continues for %s; a retry joins it)", desc.Digest, ctx.Err(), c.opts.PullLinger)
		}
		if f.err == nil {
			// The pull was shared, and blobs the cache held were not fetched at all: src answers for what it did
			// not itself deliver.
			if err := c.proveFlight(ctx, f, own, src, desc); err != nil {
				return ocispec.Descriptor{}, err
			}
			if progress != nil {
				p := f.progress()
				progress(Progress{Total: p.Total, Done: p.Total})
			}
			return f.result, nil
		}
		// A pull that every source failed is reported to each caller with its own source's failure: one registry's
		// error (a stall, a refusal) is never another's caller's answer. A caller whose source did not fail (it
		// joined too late to be asked, or the set was full) tries again with it.
		var se *sourcesError
		if !errors.As(f.err, &se) {
			return ocispec.Descriptor{}, f.err
		}
		var mine error
		if own >= 0 {
			mine = f.src.errOf(own)
		}
		switch {
		case mine != nil && errors.Is(se.last, mine):
			return ocispec.Descriptor{}, f.err
		case mine != nil:
			return ocispec.Descriptor{}, fmt.Errorf("pull %s: %w", desc.Digest, mine)
		case round >= 2 || ctx.Err() != nil:
			return ocispec.Descriptor{}, f.err
		}
	}
}

// joinFlight joins the pull of desc under way, offering src to it, or starts one from src. It returns the flight,
// the index of src among its sources (-1 if the set was full) and the caller's subscription.
func (c *Cache) joinFlight(desc ocispec.Descriptor, src oras.ReadOnlyTarget, progress func(Progress)) (*flight, int, int) {
	key := flightKey{digest: desc.Digest}
	if desc.Platform != nil && !artifact.IsManifest(desc.MediaType) {
		key.platform = artifact.PlatformString(*desc.Platform)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.flights[key]
	if f != nil && f.ctx.Err() != nil && c.ctx.Err() == nil {
		f = nil // abandoned (its linger ran out) and winding down: start afresh rather than inherit its cancellation
	}
	own := 0
	if f == nil {
		ctx, cancel := context.WithCancel(c.ctx)
		f = &flight{ctx: ctx, done: make(chan struct{}), cancel: cancel, subs: map[int]func(Progress){}, src: newSourceSet(src)}
		c.flights[key] = f
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			f.result, f.err = c.pull(ctx, f, f.src, desc)
			c.mu.Lock()
			if c.flights[key] == f {
				delete(c.flights, key)
			}
			c.mu.Unlock()
			cancel()
			f.mu.Lock()
			if f.linger != nil {
				f.linger.Stop()
			}
			f.mu.Unlock()
			if f.err != nil {
				c.m.pulls.WithLabelValues("error").Inc()
			} else {
				c.m.pulls.WithLabelValues("pulled").Inc()
			}
			close(f.done)
		}()
	} else {
		c.m.pulls.WithLabelValues("joined").Inc()
		own = f.src.add(src)
	}
	return f, own, f.join(progress)
}

func (f *flight) join(progress func(Progress)) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.linger != nil {
		f.linger.Stop()
		f.linger = nil
	}
	f.nextID++
	// A waiter without a callback still counts, so the pull is not cancelled under it.
	if progress == nil {
		progress = func(Progress) {}
	}
	f.subs[f.nextID] = progress
	return f.nextID
}

// leave drops a waiter; when none are left the pull is cancelled after linger, unless someone joins meanwhile.
func (f *flight) leave(id int, linger time.Duration) {
	f.pubMu.Lock()
	defer f.pubMu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.subs, id)
	if len(f.subs) > 0 {
		return
	}
	if linger < 0 {
		f.cancel()
		return
	}
	f.linger = time.AfterFunc(linger, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.subs) == 0 {
			f.cancel()
		}
	})
}

// completeManifest returns the manifest descriptor for a complete manifest or index digest.
func (c *Cache) completeManifest(d digest.Digest) (ocispec.Descriptor, bool) {
	rec, ok := c.completeRecord(d)
	if !ok {
		return ocispec.Descriptor{}, false
	}
	return rec.Descriptor, true
}

// completeRecord returns the record of a complete manifest or index digest, its blobs checked.
func (c *Cache) completeRecord(d digest.Digest) (*manifestRecord, bool) {
	var rec *manifestRecord
	c.db.View(func(tx *bolt.Tx) error {
		md, err := resolveDigest(tx, d)
		if err != nil {
			return err
		}
		st, found, err := stateOf(tx, md)
		if err != nil || !found || !st.Complete {
			return err
		}
		rec, err = c.manifest(tx, md)
		return err
	})
	if rec == nil {
		return nil, false
	}
	// The check on use, outside the transaction since it may re-hash: every blob there, with its size and stamp.
	bad := c.damage(rec)
	if bad != nil {
		if err := c.repair(bad); err != nil {
			c.log.Warn("taking damaged blobs out of use failed", "manifest", d.String(), "error", err.Error())
		}
		c.emptyTrash() // the views of the bad blobs go now: a volume still mounting one loses the bad files
		return nil, false
	}
	return rec, true
}

// Has reports whether the manifest or index d is in the cache, complete.
func (c *Cache) Has(d digest.Digest) bool {
	_, ok := c.completeManifest(d)
	return ok
}

// Resolve returns the manifest descriptor a complete manifest or index digest stands for on this node.
func (c *Cache) Resolve(d digest.Digest) (ocispec.Descriptor, error) {
	m, ok := c.completeManifest(d)
	if !ok {
		return ocispec.Descriptor{}, fmt.Errorf("%s: %w", d, ErrNotFound)
	}
	return m, nil
}

func (c *Cache) touch(d digest.Digest) {
	c.db.Update(func(tx *bolt.Tx) error {
		st, ok, err := stateOf(tx, d)
		if err != nil || !ok {
			return err
		}
		st.LastUsed = time.Now()
		return putJSON(tx.Bucket(bucketState), string(d), st)
	})
}

func (c *Cache) pull(ctx context.Context, f *flight, src oras.ReadOnlyTarget, desc ocispec.Descriptor) (ocispec.Descriptor, error) {
	b, err := c.fetchSmall(ctx, src, desc, "manifest")
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	p, err := parseManifest(desc, b)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	if desc.MediaType == "" {
		desc.MediaType = p.mediaType
	}
	top, topBytes := desc, b
	if p.index != nil {
		want := c.opts.Platform
		if desc.Platform != nil {
			want = *desc.Platform
		}
		m, err := choosePlatform(p.index, want)
		if err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("index %s: %w", desc.Digest, err)
		}
		if err := artifact.CheckSize("manifest", m); err != nil {
			return ocispec.Descriptor{}, err
		}
		if m.MediaType == "" {
			m.MediaType = ocispec.MediaTypeImageManifest
		}
		if b, err = c.fetchSmall(ctx, src, m, "manifest"); err != nil {
			return ocispec.Descriptor{}, err
		}
		if p, err = parseManifest(m, b); err != nil {
			return ocispec.Descriptor{}, err
		}
		if p.manifest == nil {
			return ocispec.Descriptor{}, fmt.Errorf("index %s: %w: entry %s is itself an index", desc.Digest, ErrUnsupported, m.Digest)
		}
		if desc.Platform != nil {
			top, topBytes = m, b // the manifest stands alone: the index's record stays the node's platform's
		}
		desc = m
	}
	if p.manifest.ArtifactType != "" && desc.ArtifactType == "" {
		desc.ArtifactType = p.manifest.ArtifactType
	}
	rec := &manifestRecord{
		Descriptor: ocispec.Descriptor{MediaType: desc.MediaType, Digest: desc.Digest, Size: desc.Size, Platform: desc.Platform, ArtifactType: desc.ArtifactType},
		Name:       top.Annotations[ocispec.AnnotationRefName],
		Config:     p.manifest.Config,
		Layers:     p.layers,
		Image:      p.image,
		PulledAt:   time.Now(),
		LastUsed:   time.Now(),
	}
	if top.Digest != desc.Digest {
		rec.From = &ocispec.Descriptor{MediaType: top.MediaType, Digest: top.Digest, Size: top.Size}
	}
	// Record the manifest before fetching its blobs, so GC counts them as needed from the first byte; and mark it
	// as being pulled so GC never evicts it meanwhile.
	if err := c.beginPull(rec); err != nil {
		return ocispec.Descriptor{}, err
	}
	defer c.endPull(rec.Descriptor.Digest)

	// The manifest bytes are already verified: commit them without a second fetch.
	if err := c.blobs.Ingest(ctx, desc.Digest, desc.Size, bytesSource(b)); err != nil {
		return ocispec.Descriptor{}, err
	}
	if top.Digest != desc.Digest {
		if err := c.blobs.Ingest(ctx, top.Digest, top.Size, bytesSource(topBytes)); err != nil {
			return ocispec.Descriptor{}, err
		}
	}
	cfg, err := c.fetchSmall(ctx, src, p.manifest.Config, "config")
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := c.blobs.Ingest(ctx, p.manifest.Config.Digest, p.manifest.Config.Size, bytesSource(cfg)); err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := c.fetchLayers(ctx, f, src, rec); err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := c.finishPull(rec, top); err != nil {
		return ocispec.Descriptor{}, err
	}
	f.rec = rec
	return rec.Descriptor, nil
}

// fetchSmallOnce reads a manifest, index or config fully, refusing more than artifact.MaxManifestBytes and checking
// size and digest.
func (c *Cache) fetchSmallOnce(ctx context.Context, src oras.ReadOnlyTarget, desc ocispec.Descriptor, what string) ([]byte, error) {
	if err := artifact.CheckSize(what, desc); err != nil {
		return nil, err
	}
	if rc, err := c.blobs.Open(desc.Digest); err == nil {
		// Already here (another manifest shares this config): no fetch; still bounded and verified by name.
		defer rc.Close()
		if b, err := cas.ReadAll(rc, desc.Digest, desc.Size); err == nil {
			return b, nil
		}
	}
	rc, err := src.Fetch(ctx, desc)
	if err != nil {
		return nil, fmt.Errorf("fetch %s %s: %w", what, desc.Digest, err)
	}
	defer rc.Close()
	b, err := cas.ReadAll(rc, desc.Digest, desc.Size)
	if err != nil {
		return nil, fmt.Errorf("fetch %s %s: %w", what, desc.Digest, err)
	}
	return b, nil
}

func bytesSource(b []byte) cas.OpenFunc {
	return func(context.Context, int64) (io.ReadCloser, int64, error) {
		return io.NopCloser(bytes.NewReader(b)), 0, nil
	}
}

func (c *Cache) beginPull(rec *manifestRecord) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pulling[rec.Descriptor.Digest]++
	// A collection that decided before this lock that no manifest needs these blobs deletes them after it: from
	// here on it deletes none (reaper.go); one already gone is fetched again (fetchBlob checks first).
	var need []digest.Digest
	for _, b := range rec.blobs() {
		need = append(need, b.Digest)
	}
	c.reaper.spare(need...)
	err := c.db.Update(func(tx *bolt.Tx) error {
		old, err := c.manifest(tx, rec.Descriptor.Digest)
		if err != nil {
			return err
		}
		if old != nil {
			// Pulled again (through another index): what is complete stays usable meanwhile.
			rec.PulledAt, rec.Complete = old.PulledAt, old.Complete
		}
		return putManifest(tx, rec)
	})
	if err != nil {
		c.pulling[rec.Descriptor.Digest]--
	}
	return err
}

func (c *Cache) endPull(d digest.Digest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pulling[d]--; c.pulling[d] <= 0 {
		delete(c.pulling, d)
	}
}

// finishPull marks the manifest complete and records the index it was chosen from.
func (c *Cache) finishPull(rec *manifestRecord, top ocispec.Descriptor) error {
	return c.db.Update(func(tx *bolt.Tx) error {
		rec.Complete = true
		rec.LastUsed = time.Now()
		if err := putManifest(tx, rec); err != nil {
			return err
		}
		if top.Digest != rec.Descriptor.Digest {
			return putJSON(tx.Bucket(bucketIndexes), string(top.Digest), indexRecord{
				Descriptor: ocispec.Descriptor{MediaType: top.MediaType, Digest: top.Digest, Size: top.Size},
				Manifest:   rec.Descriptor.Digest,
			})
		}
		return nil
	})
}

// fetchLayers ingests every layer, Concurrency at a time, and extracts the tar ones.
func (c *Cache) fetchLayers(ctx context.Context, f *flight, src oras.ReadOnlyTarget, rec *manifestRecord) error {
	// A layer listed twice is fetched once.
	seen := map[digest.Digest]bool{}
	var layers []artifact.Layer
	for _, l := range rec.Layers {
		if !seen[l.Digest] {
			seen[l.Digest] = true
			layers = append(layers, l)
		}
	}
	f.running = make([]atomic.Int64, len(layers))
	var total int64
	for _, l := range layers {
		total += l.Size
	}
	f.total.Store(total)
	f.publish(true)

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(c.opts.Concurrency)
	for i, l := range layers {
		g.Go(func() error {
			if err := c.fetchBlob(gctx, f, i, src, l.Descriptor); err != nil {
				return fmt.Errorf("layer %s (%s): %w", l.Digest, l.MediaType, err)
			}
			f.running[i].Store(0)
			f.present.Add(l.Size)
			f.publish(true)
			if l.Format != artifact.FormatRaw {
				if err := c.ensureLayer(gctx, l); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// fetchBlob ingests one blob, retrying twice (resuming) when a transfer breaks off: a dropped connection, or an
// abandoned pull of the same blob whose cancellation the ingest's coalescing handed to us.
func (c *Cache) fetchBlob(ctx context.Context, f *flight, i int, src oras.ReadOnlyTarget, desc ocispec.Descriptor) error {
	if s, ok := src.(*sourceSet); ok {
		defer c.wantBlob(desc.Digest, s)()
	}
	var err error
	var first atomic.Int64 // unix nanoseconds of the first byte received, for the phase log
	start := time.Now()
	defer func() {
		if f := first.Load(); f != 0 {
			c.log.Debug("phase", "phase", "blob", "digest", desc.Digest.String(), "size", desc.Size, "start", start,
				"firstByte", time.Unix(0, f), "committed", time.Now(), "error", err)
		}
	}()
	for attempt := 0; attempt < 3; attempt++ {
		if ok, serr := c.blobs.Exists(desc.Digest, desc.Size); serr != nil || ok {
			return serr
		}
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return err
			case <-time.After(time.Duration(attempt*attempt) * 250 * time.Millisecond):
			}
		}
		err = c.blobs.Ingest(ctx, desc.Digest, desc.Size, func(ctx context.Context, offset int64) (io.ReadCloser, int64, error) {
			rc, start, err := openBlob(ctx, src, desc, offset)
			if err != nil {
				return nil, 0, err
			}
			f.running[i].Store(start)
			return &countingReader{rc: rc, n: &f.running[i], fetched: c.m.fetchedBytes.Add, publish: f.publish, first: &first}, start, nil
		})
		if again, dropped := c.handOver(src, desc.Digest, err); again && ctx.Err() == nil {
			if dropped {
				attempt-- // bounded: each hand-over drops a source for good
			}
			continue
		}
		if err == nil || ctx.Err() != nil || errors.Is(err, ErrDigestMismatch) || errors.Is(err, ErrSizeMismatch) || errors.Is(err, errdef.ErrNotFound) {
			return err
		}
	}
	return err
}

type countingReader struct {
	rc      io.ReadCloser
	n       *atomic.Int64
	fetched func(float64)
	publish func(bool)
	first   *atomic.Int64 // set to the time of the first byte
}

func (r *countingReader) Read(p []byte) (int, error) {
	n, err := r.rc.Read(p)
	if n > 0 {
		if r.first.Load() == 0 {
			r.first.CompareAndSwap(0, time.Now().UnixNano())
		}
		r.n.Add(int64(n))
		r.fetched(float64(n))
		r.publish(false)
	}
	return n, err
}

func (r *countingReader) Close() error { return r.rc.Close() }

// ensureLayer extracts a tar layer once into layers/<digest>: from the verified blob, into a temporary directory
// that is renamed into place when complete.
func (c *Cache) ensureLayer(ctx context.Context, l artifact.Layer) error {
	dst := c.layerDir(l.Digest)
	if _, err := os.Lstat(dst); err == nil {
		return nil
	}
	for {
		// The shared extraction runs under the context of the caller that started it. If that caller gave up, the
		// others extract again rather than inherit its cancellation.
		lead, err := c.extractLayer(ctx, l, dst)
		if err != nil && ctx.Err() == nil && lead != ctx && lead.Err() != nil &&
			(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			continue
		}
		return err
	}
}

// extractLayer is ensureLayer's single extraction; it also returns the context the extraction ran under.
func (c *Cache) extractLayer(ctx context.Context, l artifact.Layer, dst string) (context.Context, error) {
	ch := c.layerFlight.DoChan(string(l.Digest), func() (any, error) {
		if _, err := os.Lstat(dst); err == nil {
			return ctx, nil
		}
		start := time.Now()
		blob, err := c.blobs.Open(l.Digest)
		if err != nil {
			return ctx, err
		}
		defer blob.Close()
		tmp, err := c.tempDir("layer-" + shortHex(l.Digest))
		if err != nil {
			return ctx, err
		}
		st, err := archive.Unpack(ctxReader{ctx, blob}, l.Format, tmp, archive.Options{
			Limits:           c.opts.Limits,
			Size:             l.Size,
			KeepWhiteouts:    true,
			ReadOnly:         true,
			WorldReadable:    !l.Image,
			AbsoluteSymlinks: l.Image,
		})
		if err != nil {
			removeAll(tmp)
			return ctx, fmt.Errorf("extract layer %s (%s): %w", l.Digest, l.MediaType, err)
		}
		// Stamped before the rename, which leaves the files' ctimes as they are (layerstamps.go).
		stamps, err := stampTree(tmp)
		if err != nil {
			removeAll(tmp)
			return ctx, err
		}
		// Recorded before it appears under its name (recover drops a record whose directory never appeared), and
		// with the durable mark of any earlier extraction of this digest dropped: only this extraction's own flush
		// may vouch for these files.
		var e extraction
		if err := c.db.Update(func(tx *bolt.Tx) error {
			var err error
			e, err = c.extractions.Begin(l.Digest, func() error { return tx.Bucket(bucketDurableLayers).Delete([]byte(l.Digest)) })
			if err != nil {
				return err
			}
			if err := putJSON(tx.Bucket(bucketLayerStamps), string(l.Digest), stamps); err != nil {
				return err
			}
			return putJSON(tx.Bucket(bucketLayers), string(l.Digest), st)
		}); err != nil {
			removeAll(tmp)
			return ctx, err
		}
		// The extracted files are used at once from the page cache and made durable in the background (one syncfs),
		// like blobs: a restart of the machine before that completed deletes the layer (recover).
		if err := os.Rename(tmp, dst); err != nil {
			removeAll(tmp)
			return ctx, err
		}
		c.m.extractions.Inc()
		c.m.extractSeconds.Observe(time.Since(start).Seconds())
		c.flushLayerLater(e)
		return ctx, nil
	})
	run(&c.hooks.layerFlight, func(f func(digest.Digest)) { f(l.Digest) })
	r := <-ch
	v, err := r.Val, r.Err
	lead, _ := v.(context.Context)
	if lead == nil {
		lead = ctx
	}
	return lead, err
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}
