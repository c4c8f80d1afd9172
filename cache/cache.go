package cache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sync/singleflight"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/archive"
	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/errdef"
	"github.com/modelpack/modelpack/internal/schema"
)

// Errors callers can test with errors.Is.
var (
	// ErrNotFound: the manifest is not in the cache (or its pull has not completed).
	ErrNotFound = errdef.ErrNotFound
	// ErrInUse: the content is referenced by a volume or pin, or is being pulled.
	ErrInUse = errors.New("in use")
	// ErrTooLarge: a manifest, index or config over artifact's document limits, or a layer over the archive limits.
	ErrTooLarge = artifact.ErrTooLarge
	// ErrUnsupported: a media type or manifest shape the cache cannot serve.
	ErrUnsupported = errdef.ErrUnsupported
	// ErrSizeMismatch and ErrDigestMismatch: bytes that do not match their descriptor.
	ErrSizeMismatch   = cas.ErrSizeMismatch
	ErrDigestMismatch = cas.ErrDigestMismatch
)

// Options configure a Cache.
type Options struct {
	// Root is the cache directory; views are hardlinked to blobs, so it must be one filesystem.
	Root string
	// MaxBytes caps blobs, extracted layers and partial downloads; GC evicts down to it. 0 means no cap.
	MaxBytes int64
	// HighWatermark and LowWatermark are percentages of the file system Root is on (statfs, every file on it
	// counted, as kubelet's image GC counts): once it is HighWatermark percent used, GC evicts down to what would
	// leave it LowWatermark percent used. Both 0: no watermarks; else 0 ≤ LowWatermark < HighWatermark ≤ 100.
	// With MaxBytes too, GC evicts until both hold: whichever asks for the smaller cache wins.
	HighWatermark, LowWatermark int
	// Limits cap each extracted tar layer (decompression bombs); zero fields take archive.DefaultLimits.
	Limits archive.Limits
	// Platform picks the manifest of a multi-arch index; the zero value is this node's OS and architecture.
	Platform ocispec.Platform
	// Concurrency is how many blobs a pull fetches at once (default 8).
	Concurrency int
	// PullLinger is how long a pull keeps running after every caller waiting on it has gone, so that a retry
	// (a CSI call after a deadline) joins it instead of starting over. Default 5 minutes; negative cancels at once.
	PullLinger time.Duration
	// MinAge protects content pulled or used this recently from eviction, so a pull is not evicted before the
	// volume that asked for it acquires it (a running pull and a mounted view are protected whatever their age).
	// Meanwhile the cache may exceed MaxBytes by what was used within MinAge. Default DefaultMinAge; negative
	// means no protection.
	MinAge time.Duration
	// FlushDelay is how long after the last commit of a pull its blobs and layers are flushed to disk in the
	// background (default cas.FlushDelay); until then a restart of the machine costs their re-hash, never wrong
	// bytes.
	FlushDelay time.Duration
	// LockTimeout is how long Open waits for another process holding the cache (default 10 s).
	LockTimeout time.Duration
	// VerifyInterval is how often the scrub re-hashes every blob in the background (damaged ones are quarantined
	// and pulled again by the next publish); 0 or negative: only after an unclean start and on demand (Repair).
	VerifyInterval time.Duration
	// ScrubRate caps the scrub's reads, in bytes per second (default DefaultScrubRate); negative: no cap. A use
	// waiting for a blob the scrub is re-hashing lifts the cap for that blob.
	ScrubRate int64
	// Logger receives the cache's warnings (damaged blobs); slog.Default() if nil.
	Logger *slog.Logger
	// hooks, if set (tests), are the cache's hooks from Open on, for work Open itself starts.
	hooks *hooks
	// VolatileOwnerPrefix marks the owners whose references stand for something no restart of the machine leaves
	// in place (the CSI driver's mounts): their Acquire and Release wait for no flush to disk, and their
	// references are dropped at the first Open after a restart of the machine (holds.go). "" makes none volatile.
	VolatileOwnerPrefix string
}

const defaultPullLinger = 5 * time.Minute

// DefaultScrubRate paces the scrub: a tenth of a SATA SSD's sequential reads, a 1 TiB cache every ~2.3 h.
const DefaultScrubRate = 128 << 20

// DefaultMinAge is Options.MinAge's default: long enough for a kubelet retry to acquire what its pull brought.
const DefaultMinAge = time.Minute

func (o Options) withDefaults() Options {
	if o.hooks == nil {
		o.hooks = &hooks{}
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.PullLinger == 0 {
		o.PullLinger = defaultPullLinger
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MinAge == 0 {
		o.MinAge = DefaultMinAge
	}
	if o.MinAge < 0 {
		o.MinAge = 0
	}
	if o.ScrubRate == 0 {
		o.ScrubRate = DefaultScrubRate
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = 10 * time.Second
	}
	if o.Platform.OS == "" {
		o.Platform.OS = runtime.GOOS
	}
	if o.Platform.Architecture == "" {
		o.Platform.Architecture = runtime.GOARCH
	}
	return o
}

// Cache is a node's content store. It is safe for concurrent use; one process at a time holds a cache root.
type Cache struct {
	hooks *hooks // tests' (testing.go); never nil
	opts  Options
	root  string
	blobs *cas.Store
	db    *bolt.DB
	// holds has the references of volatile owners, written without a flush to disk (holds.go).
	holds *bolt.DB
	m     *metrics
	log   *slog.Logger

	// ctx outlives the callers of Pull so that an abandoned pull can linger; Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// layerFlusher makes extracted layers durable in the background; Close flushes what it holds.
	layerFlusher *cas.Flusher[extraction]
	extractions  cas.Versions[digest.Digest] // extracted layers not yet marked durable

	// mu orders metadata decisions that must not interleave: recording a pull or a reference against GC's
	// choice of what to delete.
	mu      sync.Mutex
	flights map[flightKey]*flight
	pulling map[digest.Digest]int // manifests a running pull is filling
	held    map[digest.Digest]int // manifests a caller holds between finding them and acquiring a view (Hold)
	// reaper has what a collection decided to delete and deletes it outside mu; a pull spares what it needs again.
	reaper reaper

	// uncleanVerified: the verification an unclean start asked for has completed, so Close may clear the marker.
	unclean, uncleanVerified atomic.Bool

	layerFlight singleflight.Group
	viewFlight  singleflight.Group
	// fetching is a blob being fetched → the source sets of the pulls fetching it (see wantBlob).
	fetching sync.Map

	// layerMu guards lstamps, the stamps of extracted layers' files loaded so far (layerstamps.go).
	layerMu sync.Mutex
	lstamps map[digest.Digest]*layerStamps
}

// Open opens the cache at opts.Root, creating it, and recovers from a crash: half-built views and layers are
// deleted, interrupted writes dropped, resumable partial downloads kept.
func Open(opts Options) (*Cache, error) {
	opts = opts.withDefaults()
	if opts.Root == "" {
		return nil, errors.New("cache root not set")
	}
	if err := CheckWatermarks(opts.HighWatermark, opts.LowWatermark, "HighWatermark", "LowWatermark"); err != nil {
		return nil, err
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, err
	}
	if err := privateDir(root, opts.Logger); err != nil {
		return nil, err
	}
	for _, d := range []string{filepath.Join(root, "layers", "sha256"), filepath.Join(root, "views"), filepath.Join(root, "tmp"), filepath.Join(root, "trash")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("create cache: %w", err)
		}
	}
	blobs, err := cas.Open(root)
	if err != nil {
		return nil, err
	}
	blobs.SetFlushDelay(opts.FlushDelay)
	// The freelist is rebuilt at open rather than written on every commit: smaller, faster commits (as etcd does).
	db, err := schema.Open(filepath.Join(root, "meta.db"), metaSchema, &bolt.Options{Timeout: opts.LockTimeout, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("cache %s is held by another process (timed out after %s)", root, opts.LockTimeout)
		}
		return nil, fmt.Errorf("open cache metadata: %w", err)
	}
	holds, err := openHolds(root, opts)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open cache holds: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Cache{
		opts: opts, root: root, blobs: blobs, db: db, holds: holds, m: newMetrics(), log: opts.Logger, hooks: opts.hooks,
		ctx: ctx, cancel: cancel,
		flights: map[flightKey]*flight{}, pulling: map[digest.Digest]int{}, held: map[digest.Digest]int{}, lstamps: map[digest.Digest]*layerStamps{},
	}
	c.layerFlusher = cas.NewFlusher(blobs, c.flushLayers)
	blobs.ObserveFlushes(c.logFlush("blobs"))
	c.layerFlusher.Observe(c.logFlush("layers"))
	c.m.flushing = c.flushingGauge()
	c.m.disk = c.diskGauge()
	if err := c.recover(); err != nil {
		c.closeDBs()
		cancel()
		return nil, fmt.Errorf("recover cache %s: %w", root, err)
	}
	// The marker is created after the metadata lock is held, so it is ours; a marker already there is a process
	// that died without Close.
	_, err = os.Stat(filepath.Join(root, runningFile))
	unclean := err == nil
	if err := os.WriteFile(filepath.Join(root, runningFile), nil, 0o644); err != nil {
		c.closeDBs()
		cancel()
		return nil, err
	}
	c.unclean.Store(unclean)
	if unclean {
		// Before Open returns: no use may pass a blob on its stamp alone until it was re-hashed.
		if err := blobs.SuspectAll(); err != nil {
			c.closeDBs()
			cancel()
			return nil, err
		}
	}
	c.wg.Add(1)
	go c.maintain(unclean)
	return c, nil
}

// Close cancels lingering pulls, waits for them and for the background flush of the blobs pulled, and releases
// the cache root.
func (c *Cache) Close() error {
	c.cancel()
	c.wg.Wait()
	c.layerFlusher.Flush()
	err := c.blobs.Close()
	if err == nil && (!c.unclean.Load() || c.uncleanVerified.Load()) {
		err = os.Remove(filepath.Join(c.root, runningFile))
	}
	return errors.Join(err, c.closeDBs())
}

func (c *Cache) closeDBs() error { return errors.Join(c.holds.Close(), c.db.Close()) }

// Root is the cache directory.
func (c *Cache) Root() string { return c.root }

// Blobs is the cache's blob store (read access for callers that stream blobs, such as a registry mirror).
func (c *Cache) Blobs() *cas.Store { return c.blobs }

func (c *Cache) layerDir(d digest.Digest) string {
	return filepath.Join(c.root, "layers", d.Algorithm().String(), d.Encoded())
}

func (c *Cache) viewDir(key string) string { return filepath.Join(c.root, "views", key) }

// tempDir makes a fresh directory under tmp/; recovery deletes whatever is left there.
func (c *Cache) tempDir(prefix string) (string, error) {
	return os.MkdirTemp(filepath.Join(c.root, "tmp"), prefix+"-")
}

// recover runs at Open, before any other use.
func (c *Cache) recover() error {
	if err := c.blobs.Recover(); err != nil {
		return err
	}
	if rec := c.blobs.Recovered(); rec.BootChanged {
		c.log.Warn("the machine restarted since blobs were pulled: re-hashed those not yet known to be on disk",
			"rehashed", rec.Rehashed, "quarantined", len(rec.Quarantined))
	}
	// Anything under tmp/ was being built when the process died; anything in trash/ was being deleted.
	for _, d := range []string{"tmp", "trash"} {
		if err := c.emptyDir(filepath.Join(c.root, d)); err != nil {
			return err
		}
	}
	var dropped map[digest.Digest]bool
	var droppedViews, unflushed []digest.Digest
	if err := c.db.Update(func(tx *bolt.Tx) error {
		var err error
		if dropped, unflushed, err = c.recoverLayers(tx); err != nil {
			return err
		}
		if droppedViews, err = manifestsUsing(tx, dropped); err != nil {
			return err
		}
		if err := c.moveVolatileRefs(tx); err != nil {
			return err
		}
		return c.sealViews()
	}); err != nil {
		return err
	}
	if err := c.trashViews(droppedViews); err != nil {
		return err
	}
	for _, d := range unflushed {
		e, _ := c.extractions.Begin(d, nil) // unmarked already
		c.flushLayerLater(e)
	}
	if len(dropped) > 0 {
		c.log.Warn("the machine restarted before extracted layers reached the disk: they will be extracted again", "layers", len(dropped))
	}
	// Blobs cas quarantined (unflushed bytes lost to a power loss) are already out of the store; what was built
	// from them goes too.
	bad := map[digest.Digest]string{}
	for _, d := range c.blobs.Recovered().Quarantined {
		bad[d] = "digest mismatch after a restart of the machine (the bytes never reached the disk)"
		c.corrupt(d, "digest", bad[d])
	}
	return c.repair(bad)
}

// recoverLayers reconciles the layer directories with their records. A directory under its final name was renamed
// into place complete; one whose statistics were not yet recorded gets them now, and records of vanished
// directories go. A layer not known to be on disk is dropped after a restart of the machine (its files may never
// have reached the disk) and returned as unflushed after a process crash (correct in the page cache).
func (c *Cache) recoverLayers(tx *bolt.Tx) (dropped map[digest.Digest]bool, unflushed []digest.Digest, err error) {
	lb := tx.Bucket(bucketLayers)
	entries, err := os.ReadDir(filepath.Join(c.root, "layers", "sha256"))
	if err != nil {
		return nil, nil, err
	}
	dropped, present := map[digest.Digest]bool{}, map[digest.Digest]bool{}
	durable := tx.Bucket(bucketDurableLayers)
	for _, e := range entries {
		d := digest.NewDigestFromEncoded(digest.SHA256, e.Name())
		if d.Validate() != nil {
			continue
		}
		if durable.Get([]byte(d)) == nil {
			if c.blobs.Recovered().BootChanged {
				if err := c.trash(c.layerDir(d)); err != nil {
					return nil, nil, err
				}
				dropped[d] = true
				continue
			}
			unflushed = append(unflushed, d)
		}
		present[d] = true
		if lb.Get([]byte(d)) == nil {
			st, err := dirStats(c.layerDir(d))
			if err != nil {
				return nil, nil, err
			}
			if err := putJSON(lb, string(d), st); err != nil {
				return nil, nil, err
			}
		}
	}
	var stale [][]byte
	lb.ForEach(func(k, _ []byte) error {
		if !present[digest.Digest(k)] {
			stale = append(stale, append([]byte(nil), k...))
		}
		return nil
	})
	for _, k := range stale {
		for _, b := range [][]byte{bucketLayers, bucketDurableLayers, bucketLayerStamps} {
			if err := tx.Bucket(b).Delete(k); err != nil {
				return nil, nil, err
			}
		}
	}
	return dropped, unflushed, nil
}

// manifestsUsing lists the manifests with a layer in layers: their views hold hardlinks to the layers' files.
func manifestsUsing(tx *bolt.Tx, layers map[digest.Digest]bool) ([]digest.Digest, error) {
	ms, err := allManifests(tx)
	if err != nil {
		return nil, err
	}
	var out []digest.Digest
	for _, m := range ms {
		for _, l := range m.Layers {
			if layers[l.Digest] {
				out = append(out, m.Descriptor.Digest)
				break
			}
		}
	}
	return out, nil
}

// sealViews makes every view root read-only, as it is made after its rename: the process may have died in between.
func (c *Cache) sealViews() error {
	views, err := os.ReadDir(filepath.Join(c.root, "views"))
	if err != nil {
		return err
	}
	for _, v := range views {
		if err := os.Chmod(filepath.Join(c.root, "views", v.Name()), 0o555); err != nil {
			return err
		}
	}
	return nil
}

func randomSuffix() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// trashLocked moves a directory out of the way atomically; emptyTrash deletes it later, outside any lock.
func (c *Cache) trash(dir string) error {
	dst := filepath.Join(c.root, "trash", filepath.Base(dir)+"-"+randomSuffix())
	if err := os.Rename(dir, dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func (c *Cache) emptyTrash() error { return c.emptyDir(filepath.Join(c.root, "trash")) }

// emptyDir removes everything inside dir. A file that is a hardlink of a blob or of an extracted file (a view's)
// is unlinked so as to carry that file's stamp over the unlink's change of ctime (cas for blobs, layerstamps.go
// for extracted files): without that, deleting a view would make the next use re-hash its blobs and extract its
// layers again.
func (c *Cache) emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	var shared []string // hardlinks of extracted files
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
			switch {
			case err != nil:
			case d.IsDir():
				os.Chmod(q, 0o755) // views and layers are read-only
			case d.Type().IsRegular():
				if info, err := d.Info(); err == nil && linkCount(info) > 1 {
					blob, err := c.blobs.Unlink(q)
					if err != nil && !errors.Is(err, fs.ErrNotExist) {
						errs = append(errs, err)
					}
					if !blob && err == nil {
						shared = append(shared, q)
					}
				}
			}
			return nil
		})
	}
	errs = append(errs, c.unlinkExtracted(shared))
	for _, e := range entries {
		errs = append(errs, removeAll(filepath.Join(dir, e.Name())))
	}
	return errors.Join(errs...)
}

// removeAll is os.RemoveAll for trees with read-only directories (views and layers), which only root could
// otherwise delete.
func removeAll(p string) error {
	err := os.RemoveAll(p)
	if err == nil || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(q, 0o755)
		}
		return nil
	})
	return os.RemoveAll(p)
}

// dirStats counts the entries and file bytes of an extracted tree (hardlinked files counted once).
func dirStats(dir string) (archive.Stats, error) {
	var st archive.Stats
	seen := map[uint64]bool{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		st.Entries++
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			if ino, ok := inode(info); ok {
				if seen[ino] {
					return nil
				}
				seen[ino] = true
			}
			st.Bytes += info.Size()
		}
		return nil
	})
	return st, err
}

// shortHex shortens a digest for messages.
func shortHex(d digest.Digest) string {
	s := d.Encoded()
	if len(s) > 12 {
		s = s[:12]
	}
	return strings.TrimSpace(s)
}

// privateDir makes dir, the cache root, its owner's alone (0700). The cache holds every tenant's models, and the
// access records decide who may read one: a local user walking the host path to a view would pass them by. Pods
// lose nothing, since a pod reads its model through its own bind mount, whose source's parents it never walks.
// A root left open by an older release is closed, and the fix logged.
func privateDir(dir string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create cache: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("create cache: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("cache root %s is open to other users (%s) and cannot be closed: %w", dir, fi.Mode().Perm(), err)
		}
		log.Warn("cache root was open to other users: closed it", "root", dir, "was", fi.Mode().Perm().String())
	}
	return nil
}
