package cache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	bolt "go.etcd.io/bbolt"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/archive"
)

// GCStats says what a collection did.
type GCStats struct {
	Before  int64           `json:"before"` // usage in bytes
	After   int64           `json:"after"`
	Evicted []digest.Digest `json:"evicted,omitempty"` // manifests
	Blobs   int             `json:"blobs"`             // blobs deleted
	Layers  int             `json:"layers"`            // extracted layers deleted
	Views   int             `json:"views"`             // views deleted
	// Partials counts partial downloads deleted: those of blobs no manifest in the cache needs any more.
	Partials int           `json:"partials"`
	Duration time.Duration `json:"duration"`
}

// Usage is what the cache holds.
type Usage struct {
	Bytes      int64 `json:"bytes"` // Blobs + Layers + Partials: what MaxBytes caps
	MaxBytes   int64 `json:"maxBytes,omitempty"`
	Blobs      int64 `json:"blobBytes"`
	BlobCount  int   `json:"blobs"`
	Layers     int64 `json:"layerBytes"` // extracted tar layers
	LayerCount int   `json:"layers"`
	Partials   int64 `json:"partialBytes"`
	Manifests  int   `json:"manifests"`
	Views      int   `json:"views"`
	Refs       int   `json:"refs"`
	// Referenced is the part of Bytes that a reference or a running pull needs: what GC can never free.
	Referenced int64 `json:"referencedBytes"`
}

// Entry describes a manifest in the cache.
type Entry struct {
	Descriptor ocispec.Descriptor `json:"descriptor"`
	Name       string             `json:"name,omitempty"`
	Image      bool               `json:"image"`
	Indexes    []digest.Digest    `json:"indexes,omitempty"` // indexes it was chosen from
	Layers     int                `json:"layers"`
	Size       int64              `json:"size"` // bytes of its blobs
	Complete   bool               `json:"complete"`
	Refs       []string           `json:"refs,omitempty"`
	Views      []string           `json:"views,omitempty"`
	PulledAt   time.Time          `json:"pulledAt"`
	LastUsed   time.Time          `json:"lastUsed"`
}

// Ref is one owner's reference.
type Ref struct {
	Owner    string        `json:"owner"`
	Manifest digest.Digest `json:"manifest"`
	Selector Selector      `json:"selector"`
	View     string        `json:"view"`
	Since    time.Time     `json:"since"`
}

// snapshot is the metadata GC and the reports work from, read in one transaction.
type snapshot struct {
	manifests []*manifestRecord
	indexes   map[digest.Digest]indexRecord
	refs      map[string]refRecord // meta.db's and the holds file's
	layers    map[digest.Digest]archive.Stats
	// usedLater are the manifests whose last use the holds file has later than meta.db (their LastUsed is it).
	usedLater []*manifestRecord
}

func (c *Cache) snapshot(tx *bolt.Tx) (*snapshot, error) {
	s := &snapshot{indexes: map[digest.Digest]indexRecord{}, layers: map[digest.Digest]archive.Stats{}}
	var err error
	if s.manifests, err = allManifests(tx); err != nil {
		return nil, err
	}
	var used map[digest.Digest]time.Time
	if s.refs, used, err = c.allHolds(tx); err != nil {
		return nil, err
	}
	for _, m := range s.manifests {
		if t := used[m.Descriptor.Digest]; t.After(m.LastUsed) {
			m.LastUsed = t
			s.usedLater = append(s.usedLater, m)
		}
	}
	if err := tx.Bucket(bucketIndexes).ForEach(func(k, v []byte) error {
		var r indexRecord
		_, err := getJSON(tx.Bucket(bucketIndexes), string(k), &r)
		s.indexes[digest.Digest(k)] = r
		return err
	}); err != nil {
		return nil, err
	}
	err = tx.Bucket(bucketLayers).ForEach(func(k, v []byte) error {
		var st archive.Stats
		_, err := getJSON(tx.Bucket(bucketLayers), string(k), &st)
		s.layers[digest.Digest(k)] = st
		return err
	})
	return s, err
}

// needs lists the blobs (and, for tar layers, the extracted layers) of the given manifests.
func (s *snapshot) needs(keep func(*manifestRecord) bool) (blobs, layers map[digest.Digest]bool) {
	blobs, layers = map[digest.Digest]bool{}, map[digest.Digest]bool{}
	kept := map[digest.Digest]bool{}
	for _, m := range s.manifests {
		if !keep(m) {
			continue
		}
		kept[m.Descriptor.Digest] = true
		for _, b := range m.blobs() {
			blobs[b.Digest] = true
		}
		for _, l := range m.Layers {
			if l.Format != artifact.FormatRaw {
				layers[l.Digest] = true
			}
		}
	}
	for d, ix := range s.indexes {
		if kept[ix.Manifest] {
			blobs[d] = true
		}
	}
	return blobs, layers
}

// GC evicts unreferenced manifests, least recently used first, until usage is at most MaxBytes and, once the file
// system reached HighWatermark percent used, until it would be at LowWatermark (watermark.go), then deletes
// every blob, extracted layer, view and partial download that no remaining manifest needs. Content a reference
// or a running pull needs, or that was used within MinAge, is never evicted. Safe to run concurrently with Pull
// and Acquire: they and GC's decisions are ordered by one lock, directories leave by atomic rename, and blobs are
// unlinked after that lock is released, each only if no pull needed it meanwhile (reaper.go).
func (c *Cache) GC(ctx context.Context) (GCStats, error) {
	start := time.Now()
	var st GCStats
	err := c.collect(ctx, &st, nil)
	st.Duration = time.Since(start)
	c.m.gcRuns.Inc()
	c.m.gcEvictions.Add(float64(len(st.Evicted)))
	if u, uerr := c.Usage(); uerr == nil {
		st.After = u.Bytes
		c.m.gcFreed.Add(float64(max(st.Before-st.After, 0)))
	}
	return st, err
}

// Remove deletes a manifest (or the manifest an index digest chose) and whatever only it needed. It refuses with
// ErrInUse while a reference or a pull uses it.
func (c *Cache) Remove(d digest.Digest) error {
	var st GCStats
	return c.collect(context.Background(), &st, &d)
}

// collect is one collection in three steps, each under only the lock it needs: the store is listed with no lock
// (what appears after the listing is swept next time), the decision is taken and committed under c.mu, and the
// files decided on are deleted outside it. With remove set it evicts exactly that manifest instead of applying
// the LRU policy.
func (c *Cache) collect(ctx context.Context, st *GCStats, remove *digest.Digest) error {
	c.reaper.run.Lock()
	defer c.reaper.run.Unlock()
	disk, err := c.listDisk()
	if err != nil {
		return err
	}
	c.mu.Lock()
	p, err := c.decide(ctx, st, remove, disk)
	c.mu.Unlock()
	if p != nil {
		err = errors.Join(err, c.reap(p, st))
	}
	// Deleting the renamed-away trees takes time proportional to their files: outside the lock too.
	return errors.Join(err, c.emptyTrash())
}

// onDisk is a listing of the blob store: committed blobs and partial downloads with their sizes.
type onDisk struct {
	blobs, partials map[digest.Digest]int64
}

func (c *Cache) listDisk() (onDisk, error) {
	d := onDisk{blobs: map[digest.Digest]int64{}}
	if err := c.blobs.Walk(func(b digest.Digest, size int64) error {
		d.blobs[b] = size
		return nil
	}); err != nil {
		return d, err
	}
	var err error
	d.partials, err = c.blobs.Partials()
	return d, err
}

// reapPlan is what a collection decided to delete outside the lock.
type reapPlan struct {
	needed   map[digest.Digest]bool // the blobs the kept manifests need
	blobs    []digest.Digest        // committed blobs no kept manifest needs
	partials []digest.Digest        // partial downloads of blobs no kept manifest needs
}

// decide runs with c.mu held: it commits the evictions and renames the extracted layers and views to go into
// trash/, and dooms the blobs and partial downloads to go (reaper.go), which reap deletes after c.mu is released.
func (c *Cache) decide(ctx context.Context, st *GCStats, remove *digest.Digest, disk onDisk) (*reapPlan, error) {
	u, err := c.usageLocked(disk)
	if err != nil {
		return nil, err
	}
	st.Before = u.Bytes
	target, over, fs, err := c.target(u)
	if err != nil {
		return nil, err
	}
	// Metadata first, files after its commit: a crash in between leaves files no record needs, which the next
	// collection sweeps, never a record whose files are gone.
	var s *snapshot
	evict := map[digest.Digest]bool{}
	err = c.db.Update(func(tx *bolt.Tx) error {
		var err error
		if s, err = c.snapshot(tx); err != nil {
			return err
		}
		inUse := c.inUseLocked(s)
		if remove != nil {
			target := *remove
			if ix, ok := s.indexes[target]; ok {
				target = ix.Manifest
			}
			found := false
			for _, m := range s.manifests {
				found = found || m.Descriptor.Digest == target
			}
			if !found {
				return fmt.Errorf("%s: %w", *remove, ErrNotFound)
			}
			if inUse[target] {
				return fmt.Errorf("%s: %w by %s", target, ErrInUse, strings.Join(c.usersLocked(s, target), ", "))
			}
			evict[target] = true
		} else if over {
			c.chooseEvictions(s, u, disk, inUse, evict, target)
		}
		for d := range evict {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := deleteManifest(tx, d); err != nil {
				return err
			}
			st.Evicted = append(st.Evicted, d)
		}
		for d, ix := range s.indexes {
			if evict[ix.Manifest] {
				if err := tx.Bucket(bucketIndexes).Delete([]byte(d)); err != nil {
					return err
				}
			}
		}
		// Last uses only the holds file has would not survive a restart of the machine: this commit is durable.
		for _, m := range s.usedLater {
			if !evict[m.Descriptor.Digest] {
				if err := putJSON(tx.Bucket(bucketState), string(m.Descriptor.Digest), manifestState{m.Descriptor, m.Complete, m.LastUsed}); err != nil {
					return err
				}
			}
		}
		sort.Slice(st.Evicted, func(i, j int) bool { return st.Evicted[i] < st.Evicted[j] })
		_, layers := s.needs(func(m *manifestRecord) bool { return !evict[m.Descriptor.Digest] })
		for d := range s.layers {
			if !layers[d] {
				if err := deleteLayerRecords(tx, d); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.logEvictions(s, evict, u, over, target, fs)
	return c.sweep(s, evict, disk, st)
}

// logEvictions says at info what GC evicted and why, and when the cache stays over its target (MaxBytes, or what
// the low watermark leaves it) because what is left is in use or younger than MinAge: an operator sizing
// --cache-max-size or the watermarks needs both.
func (c *Cache) logEvictions(s *snapshot, evict map[digest.Digest]bool, u Usage, over bool, target int64, fs fsUsage) {
	why := []any{"usageBytes", u.Bytes, "maxBytes", c.opts.MaxBytes, "targetBytes", target}
	if c.opts.HighWatermark > 0 {
		why = append(why, "diskPercent", fs.percent(), "highWatermark", c.opts.HighWatermark, "lowWatermark", c.opts.LowWatermark)
	}
	for _, m := range s.manifests {
		if evict[m.Descriptor.Digest] {
			c.opts.Logger.Info("evicted from the cache", append([]any{"manifest", m.Descriptor.Digest.String(), "name", m.Name,
				"lastUsed", m.LastUsed.UTC().Format(time.RFC3339)}, why...)...)
		}
	}
	if over && len(evict) == 0 {
		c.opts.Logger.Info("the cache is over its maximum size or high watermark, and all of it is in use or used within the minimum age",
			append(why, "minAge", c.opts.MinAge.String())...)
	}
}

// chooseEvictions picks LRU victims among unused manifests until what remains fits target. A victim frees the
// blobs and layers no other kept manifest shares.
func (c *Cache) chooseEvictions(s *snapshot, u Usage, disk onDisk, inUse, evict map[digest.Digest]bool, target int64) {
	// What each blob occupies on disk, committed or partial; extracted layers are keyed "layer:<digest>".
	onDisk := map[digest.Digest]int64{}
	for d, n := range disk.blobs {
		onDisk[d] = n
	}
	for d, n := range disk.partials {
		onDisk[d] += n
	}
	for d, st := range s.layers {
		onDisk["layer:"+d] = st.Bytes
	}
	keys := func(m *manifestRecord) map[digest.Digest]bool {
		out := map[digest.Digest]bool{}
		for _, b := range m.blobs() {
			out[b.Digest] = true
		}
		for _, l := range m.Layers {
			if l.Format != artifact.FormatRaw {
				out["layer:"+l.Digest] = true
			}
		}
		return out
	}
	users := map[digest.Digest]int{}
	for _, m := range s.manifests {
		for k := range keys(m) {
			users[k]++
		}
	}
	for d, ix := range s.indexes {
		if !evict[ix.Manifest] {
			users[d]++
		}
	}
	// What no manifest needs is swept whatever is evicted: it does not count.
	remaining := u.Bytes
	for k, n := range onDisk {
		if users[k] == 0 {
			remaining -= n
		}
	}
	victims := make([]*manifestRecord, 0, len(s.manifests))
	cutoff := time.Now().Add(-c.opts.MinAge)
	for _, m := range s.manifests {
		if !inUse[m.Descriptor.Digest] && m.LastUsed.Before(cutoff) {
			victims = append(victims, m)
		}
	}
	sort.Slice(victims, func(i, j int) bool { return victims[i].LastUsed.Before(victims[j].LastUsed) })
	for _, m := range victims {
		if remaining <= target {
			break
		}
		evict[m.Descriptor.Digest] = true
		for k := range keys(m) {
			if users[k]--; users[k] == 0 {
				remaining -= onDisk[k]
			}
		}
		for d, ix := range s.indexes {
			if ix.Manifest == m.Descriptor.Digest {
				if users[d]--; users[d] == 0 {
					remaining -= onDisk[d]
				}
			}
		}
	}
}

// sweep runs under c.mu, so no pull can start needing something between the snapshot and the decision: it renames
// to trash/ the extracted layers no kept manifest needs, the views of evicted or vanished manifests and partial
// (selector) views no reference uses, and dooms the blobs and partial downloads no kept manifest needs, for reap.
func (c *Cache) sweep(s *snapshot, evict map[digest.Digest]bool, disk onDisk, st *GCStats) (*reapPlan, error) {
	blobs, layers := s.needs(func(m *manifestRecord) bool { return !evict[m.Descriptor.Digest] })
	p := &reapPlan{needed: blobs}
	kept := map[string]bool{}
	for _, m := range s.manifests {
		if !evict[m.Descriptor.Digest] {
			kept[m.Descriptor.Digest.Encoded()] = true
		}
	}
	doomed := map[digest.Digest]bool{}
	for d := range disk.blobs {
		if !blobs[d] {
			p.blobs = append(p.blobs, d)
			doomed[d] = true
		}
	}
	for d := range disk.partials {
		if !blobs[d] {
			p.partials = append(p.partials, d)
			doomed[d] = true
		}
	}
	// Lock files of blobs no kept manifest needs go with them (removeStaleLocks): doomed too, so a pull that
	// needs one again keeps it.
	for d := range c.staleLocks() {
		if !blobs[d] {
			doomed[d] = true
		}
	}
	c.reaper.doom(doomed)
	var errs []error
	extracted, err := os.ReadDir(filepath.Join(c.root, "layers", "sha256"))
	if err != nil {
		return p, err
	}
	for _, e := range extracted {
		if d := digest.NewDigestFromEncoded(digest.SHA256, e.Name()); !layers[d] {
			if err := c.trash(c.layerDir(d)); err != nil {
				errs = append(errs, err)
				continue
			}
			st.Layers++
		}
	}
	views, err := os.ReadDir(filepath.Join(c.root, "views"))
	if err != nil {
		return p, err
	}
	referenced := map[string]bool{}
	for _, r := range s.refs {
		referenced[r.View] = true
	}
	for _, v := range views {
		m, _, partial := strings.Cut(v.Name(), "-")
		// A manifest's whole view stays while the manifest does, ready for the next volume; a partial view
		// (one selector's) goes once nothing uses it, so that selectors cannot pile views up.
		if !kept[m] || (partial && !referenced[v.Name()]) {
			if err := c.trash(c.viewDir(v.Name())); err != nil {
				errs = append(errs, err)
				continue
			}
			st.Views++
		}
	}
	return p, errors.Join(errs...)
}

// reap deletes, outside c.mu, what sweep doomed and no pull has needed since (reaper.go), then what needs no
// decision: partial downloads abandoned for their linger (an ingest holding one keeps it) and the quarantine.
func (c *Cache) reap(p *reapPlan, st *GCStats) error {
	var errs []error
	for _, d := range p.blobs {
		ok, err := c.reaper.reap(d, func() error { return c.blobs.Delete(d) })
		switch {
		case err != nil:
			errs = append(errs, err)
		case ok:
			st.Blobs++
		}
	}
	for _, d := range p.partials {
		var dropped bool
		if _, err := c.reaper.reap(d, func() error {
			var err error
			dropped, err = c.blobs.DropPartial(d)
			return err
		}); err == nil && dropped {
			st.Partials++
		}
	}
	c.removeStaleLocks(p.needed)
	spared := c.reaper.done()
	// A spared blob's scan report stays: the pull that needed it again uses it.
	if err := c.forgetScans(func(d digest.Digest) bool { return p.needed[d] || spared[d] }); err != nil {
		errs = append(errs, err)
	}
	st.Partials += c.dropStalePartials(time.Now())
	if _, err := c.blobs.PurgeQuarantine(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// staleLocks lists the lock files cas leaves behind after each ingest, by digest, except those of partial
// downloads (an ingest may be about to take them).
func (c *Cache) staleLocks() map[digest.Digest]string {
	dir := filepath.Join(c.root, "ingest")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	present := map[string]bool{}
	for _, e := range entries {
		present[e.Name()] = true
	}
	out := map[digest.Digest]string{}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".lock")
		if !ok || present[name+".partial"] {
			continue
		}
		alg, hex, _ := strings.Cut(name, "-")
		if d := digest.NewDigestFromEncoded(digest.Algorithm(alg), hex); d.Validate() == nil {
			out[d] = filepath.Join(dir, e.Name())
		}
	}
	return out
}

// removeStaleLocks deletes the lock files of committed blobs (an ingest returns before locking when the blob
// exists) and of blobs the collection doomed and no pull spared. Locks of needed blobs not yet here are kept: an
// ingest may be about to take them. One process holds the cache.
func (c *Cache) removeStaleLocks(needed map[digest.Digest]bool) {
	for d, path := range c.staleLocks() {
		if needed[d] {
			if _, err := c.blobs.Stat(d); err == nil {
				os.Remove(path)
			}
			continue
		}
		c.reaper.reap(d, func() error { return os.Remove(path) })
	}
}

// inUseLocked is the manifests GC must keep: referenced, being pulled, or held by a caller about to acquire them.
func (c *Cache) inUseLocked(s *snapshot) map[digest.Digest]bool {
	inUse := map[digest.Digest]bool{}
	for _, r := range s.refs {
		inUse[r.Manifest] = true
	}
	for d := range c.pulling {
		inUse[d] = true
	}
	for d := range c.held {
		inUse[d] = true
	}
	return inUse
}

// refOwners are the owners of references to d, sorted.
func refOwners(s *snapshot, d digest.Digest) []string {
	var out []string
	for owner, r := range s.refs {
		if r.Manifest == d {
			out = append(out, owner)
		}
	}
	sort.Strings(out)
	return out
}

// usersLocked names what keeps d: its owners, a pull, a hold.
func (c *Cache) usersLocked(s *snapshot, d digest.Digest) []string {
	out := refOwners(s, d)
	if c.pulling[d] > 0 {
		out = append(out, "a running pull")
	}
	if c.held[d] > 0 {
		out = append(out, "a publish about to mount it")
	}
	return out
}

// Usage reports what the cache holds.
// The store is listed before the lock is taken: the listing reads every blob's size, and the lock is a publish's.
func (c *Cache) Usage() (Usage, error) {
	disk, err := c.listDisk()
	if err != nil {
		return Usage{MaxBytes: c.opts.MaxBytes}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.usageLocked(disk)
}

func (c *Cache) usageLocked(disk onDisk) (Usage, error) {
	u := Usage{MaxBytes: c.opts.MaxBytes}
	sizes := disk.blobs
	for _, size := range sizes {
		u.Blobs += size
		u.BlobCount++
	}
	for _, n := range disk.partials {
		u.Partials += n
	}
	views, err := os.ReadDir(filepath.Join(c.root, "views"))
	if err != nil {
		return u, err
	}
	u.Views = len(views)
	err = c.db.View(func(tx *bolt.Tx) error {
		s, err := c.snapshot(tx)
		if err != nil {
			return err
		}
		u.Manifests, u.Refs = len(s.manifests), len(s.refs)
		for _, st := range s.layers {
			u.Layers += st.Bytes
			u.LayerCount++
		}
		inUse := c.inUseLocked(s)
		blobs, layers := s.needs(func(m *manifestRecord) bool { return inUse[m.Descriptor.Digest] })
		for d := range blobs {
			u.Referenced += sizes[d]
		}
		for d := range layers {
			u.Referenced += s.layers[d].Bytes
		}
		return nil
	})
	u.Bytes = u.Blobs + u.Layers + u.Partials
	return u, err
}

// List describes every manifest in the cache, most recently used first.
func (c *Cache) List() ([]Entry, error) {
	var out []Entry
	views, err := os.ReadDir(filepath.Join(c.root, "views"))
	if err != nil {
		return nil, err
	}
	err = c.db.View(func(tx *bolt.Tx) error {
		s, err := c.snapshot(tx)
		if err != nil {
			return err
		}
		for _, m := range s.manifests {
			e := Entry{
				Descriptor: m.Descriptor, Name: m.Name, Image: m.Image, Layers: len(m.Layers), Complete: m.Complete,
				PulledAt: m.PulledAt, LastUsed: m.LastUsed,
			}
			for _, b := range m.blobs() {
				e.Size += b.Size
			}
			for d, ix := range s.indexes {
				if ix.Manifest == m.Descriptor.Digest {
					e.Indexes = append(e.Indexes, d)
				}
			}
			sort.Slice(e.Indexes, func(i, j int) bool { return e.Indexes[i] < e.Indexes[j] })
			e.Refs = refOwners(s, m.Descriptor.Digest)
			for _, v := range views {
				if v.Name() == m.Descriptor.Digest.Encoded() || strings.HasPrefix(v.Name(), m.Descriptor.Digest.Encoded()+"-") {
					e.Views = append(e.Views, v.Name())
				}
			}
			out = append(out, e)
		}
		return nil
	})
	sort.SliceStable(out, func(i, j int) bool { return out[i].LastUsed.After(out[j].LastUsed) })
	return out, err
}

// Refs lists every reference, by owner.
func (c *Cache) Refs() ([]Ref, error) {
	var out []Ref
	err := c.db.View(func(tx *bolt.Tx) error {
		refs, _, err := c.allHolds(tx)
		for owner, r := range refs {
			out = append(out, Ref{Owner: owner, Manifest: r.Manifest, Selector: r.Selector, View: c.viewDir(r.View), Since: r.Since})
		}
		return err
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Owner < out[j].Owner })
	return out, err
}

// Problem is one thing Verify found wrong.
type Problem struct {
	Digest digest.Digest `json:"digest"`
	What   string        `json:"what"`
}

// VerifyReport is what Verify checked and found.
type VerifyReport struct {
	Blobs    int       `json:"blobs"`
	Bytes    int64     `json:"bytes"`
	Problems []Problem `json:"problems,omitempty"`
	// Repaired lists the blobs Repair took out of use (quarantined; their manifests are pulled again).
	Repaired []digest.Digest `json:"repaired,omitempty"`
}

// Verify re-hashes every blob and checks that every complete manifest has its blobs. It reports; it does not
// repair (Remove and pull again does). A missing extracted layer is not a problem: the next view extracts it.
func (c *Cache) Verify(ctx context.Context) (VerifyReport, error) {
	var r VerifyReport
	all, _, err := c.allBlobs()
	if err != nil {
		return r, err
	}
	var mu sync.Mutex
	work := make(chan blobRef)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for b := range work {
				err := c.blobs.Verify(b.d)
				mu.Lock()
				r.Blobs++
				r.Bytes += b.size
				if err != nil {
					r.Problems = append(r.Problems, Problem{b.d, err.Error()})
				}
				mu.Unlock()
			}
		})
	}
	for _, b := range all {
		if ctx.Err() != nil {
			break
		}
		work <- b
	}
	close(work)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return r, err
	}
	err = c.db.View(func(tx *bolt.Tx) error {
		ms, err := allManifests(tx)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if !m.Complete {
				continue
			}
			for _, b := range m.blobs() {
				if ok, err := c.blobs.Exists(b.Digest, b.Size); err != nil || !ok {
					r.Problems = append(r.Problems, Problem{b.Digest, fmt.Sprintf("missing blob of manifest %s", m.Descriptor.Digest)})
				}
			}
		}
		return nil
	})
	sort.Slice(r.Problems, func(i, j int) bool { return r.Problems[i].Digest < r.Problems[j].Digest })
	c.m.verifyProblems.Add(float64(len(r.Problems)))
	return r, err
}
