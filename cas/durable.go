package cas

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gofrs/flock"
	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/internal/diskio"
)

// Durability. A blob is committed (renamed under its name) as soon as its bytes are verified, without waiting for
// the disk: a reader in this boot reads them from the page cache, which a process crash does not lose. A flusher
// then makes the blobs committed close together durable in the background, as one batch (fdatasync of each blob,
// then one fsync of each directory naming them), and only after that creates their durable marks,
// ingest/durable/<alg>-<hex>. A mark is written after the flush of the very bytes it names (a blob deleted and
// committed again meanwhile waits for its own flush), so if the mark survived a power loss, so did the bytes.
//
// ingest/boot-id names the boot in which the unmarked blobs were committed. When Open finds another boot id
// (the machine restarted: maybe a power loss), every unmarked blob is re-hashed before anything can use it; a
// blob whose bytes do not match is quarantined. With the same boot id (a process crash) the unmarked blobs are
// correct in the page cache and are only flushed and marked. A store from before the marks existed (no boot-id
// file) fsynced every blob before its commit: its blobs are marked durable as they are.

// bootIDFile is where the kernel publishes this boot's random id; tests point it elsewhere to fake a reboot.
var bootIDFile = "/proc/sys/kernel/random/boot_id"

// flushHook, if set (tests), runs in the flusher for each blob of a batch before the batch is flushed: a gate to
// hold blobs unmarked. Atomic: a store's delayed flush may run while a later test sets it.
var flushHook atomic.Pointer[func(digest.Digest)]

// Recovery is what Open did about blobs that were not yet durable.
type Recovery struct {
	// BootChanged: the machine restarted since unmarked blobs were committed; they were re-hashed.
	BootChanged bool
	// Rehashed counts unmarked blobs re-hashed because of a restart; Flushed counts those that only needed a flush.
	Rehashed, Flushed int
	// Quarantined lists blobs whose bytes no longer matched their digest; they were moved to quarantine/.
	Quarantined []digest.Digest
}

func (s *Store) markPath(d digest.Digest) string {
	return filepath.Join(s.root, "ingest", "durable", d.Algorithm().String()+"-"+d.Encoded())
}

// Durable reports whether a committed blob is known to be on disk (its flush completed).
func (s *Store) Durable(d digest.Digest) bool {
	_, err := os.Lstat(s.markPath(d))
	return err == nil
}

// FlushDelay is how long the flusher waits after the last commit before it flushes what was committed. A flush
// allocates the blobs' blocks, and on a journalling filesystem (ext4 data=ordered) every fsync that follows (the
// cache's metadata commit, the driver's volume record) then waits for those bytes to reach the disk: flushing while
// a pull and its mount are still under way would put the whole flush back on their path (README, Performance). A
// pull commits its last blob, records, builds its view and mounts within milliseconds.
var FlushDelay = 2 * time.Second

// SetFlushDelay sets this store's flush delay (its own and that of every Flusher on it), in place of FlushDelay;
// 0 or negative restores FlushDelay.
func (s *Store) SetFlushDelay(d time.Duration) { s.delay.Store(int64(d)) }

func (s *Store) flushDelay() time.Duration {
	if d := time.Duration(s.delay.Load()); d > 0 {
		return d
	}
	return FlushDelay
}

// syncHook, if set (tests), is told of each flush the protocol completes: "data" (a blob's fdatasync) or "dir" (a
// directory's fsync), with its path.
var syncHook atomic.Pointer[func(kind, path string)]

// commit is one commit of a blob's bytes under its name: deleted and committed again, it is another.
type commit = Version[digest.Digest]

// unmark begins a commit of d about to be renamed into place and drops d's mark, so that neither a stale mark nor
// the flush of an earlier commit of d (still under way) vouches for the new bytes.
func (s *Store) unmark(d digest.Digest) (commit, error) {
	return s.commits.Begin(d, func() error {
		if err := os.Remove(s.markPath(d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	})
}

// mark records that c's bytes and name are on disk, unless its blob was committed again since.
func (s *Store) mark(c commit) error {
	return s.commits.Mark(c, func() error {
		// Not synced itself: a mark lost to a power loss only costs a re-hash.
		mf, err := os.OpenFile(s.markPath(c.Key), os.O_WRONLY|os.O_CREATE, 0o444)
		if err != nil {
			return err
		}
		return mf.Close()
	})
}

// forget drops a commit whose blob is gone (deleted, quarantined) before its mark: nothing is left to mark, and a
// long-running store must not keep every such commit.
func (s *Store) forget(c commit) { s.commits.Mark(c, func() error { return nil }) }

// flushLater makes a commit durable in the background, with the blobs committed close to it (see Flusher); Sync
// does it at once.
func (s *Store) flushLater(c commit) { s.flusher.Add(c) }

// flushBatch is the flusher's work: one batch of committed blobs made durable.
func (s *Store) flushBatch(batch []commit) {
	if hook := flushHook.Load(); hook != nil {
		for _, c := range batch {
			(*hook)(c.Key)
		}
	}
	if err := s.makeDurable(batch); err != nil {
		s.flushErr.CompareAndSwap(nil, &err)
	}
}

// makeDurable flushes committed blobs — each one's bytes, then once each directory naming them — and only then
// marks them durable: a mark vouches for both the bytes and the name. A blob deleted meanwhile is skipped.
func (s *Store) makeDurable(batch []commit) error {
	var errs []error
	byDir := map[string][]commit{}
	var dirs []string
	// Without its barrier (a file put in its place) the flush still runs, unpaced, and says why.
	barrier, err := s.openBarrier()
	if err != nil {
		errs = append(errs, fmt.Errorf("flush barrier: %w", err))
	} else {
		defer barrier.Close()
	}
	for _, c := range batch {
		if err := fdatasync(s.Path(c.Key), barrier); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				s.forget(c)
			} else {
				errs = append(errs, fmt.Errorf("flush %s: %w", c.Key, err))
			}
			continue
		}
		dir := filepath.Dir(s.Path(c.Key))
		if byDir[dir] == nil {
			dirs = append(dirs, dir)
		}
		byDir[dir] = append(byDir[dir], c)
	}
	for _, dir := range dirs {
		if err := syncDir(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, c := range byDir[dir] {
			errs = append(errs, s.mark(c))
		}
	}
	return errors.Join(errs...)
}

// flushChunk is how much of a blob the flusher writes back before it flushes the disk's write cache. Every fsync
// on the disk sends that cache flush too, and waits for whatever was written back since the last one: a publish's
// metadata commit or the driver's volume record waits behind a whole blob's bytes when the flush writes a blob back
// at once, and still behind large chunks with one cache flush per blob. Small chunks with a cache flush after each
// keep a concurrent record write as fast as with no flush running, and the flush itself takes no longer (the flush
// area of `make bench` measures both; docs/benchmarks.md has the figures).
var flushChunk int64 = 2 << 20

// rangeHook, if set (tests), runs before each chunk a flush writes back: a gate to hold a flush half way.
var rangeHook atomic.Pointer[func(path string, off, n int64)]

// openBarrier opens the store's barrier: an empty file, so its fdatasync writes nothing and only flushes the disk's
// write cache (ext4 and XFS send the flush for a file with nothing to write; a directory's fsync on XFS does not).
func (s *Store) openBarrier() (*os.File, error) {
	return os.OpenFile(filepath.Join(s.root, "ingest", "barrier"), os.O_RDONLY|os.O_CREATE|syscall.O_NOFOLLOW, 0o644)
}

// fdatasync makes a blob's bytes durable, a chunk at a time (flushChunk), each chunk followed by a flush of the
// disk's write cache (an fdatasync of barrier), then with the fdatasync that also flushes what reading them needs.
func fdatasync(path string, barrier *os.File) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = writeBack(f, path, barrier)
	if err == nil {
		err = diskio.Fdatasync(f)
	}
	f.Close()
	if hook := syncHook.Load(); hook != nil && err == nil {
		(*hook)("data", path)
	}
	return err
}

func writeBack(f *os.File, path string, barrier *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	for off := int64(0); off < fi.Size(); off += flushChunk {
		n := min(flushChunk, fi.Size()-off)
		if hook := rangeHook.Load(); hook != nil {
			(*hook)(path, off, n)
		}
		if err := diskio.WriteBack(f, off, n); err != nil {
			return err
		}
		if barrier == nil {
			continue
		}
		if err := diskio.Fdatasync(barrier); err != nil {
			return err
		}
		if hook := syncHook.Load(); hook != nil {
			(*hook)("barrier", path)
		}
	}
	return nil
}

func syncDir(dir string) error {
	err := diskio.SyncDir(dir)
	if hook := syncHook.Load(); hook != nil && err == nil {
		(*hook)("dir", dir)
	}
	return err
}

// Sync makes every blob committed so far by this Store durable now, waits for flushes under way, and reports the
// first flush error.
func (s *Store) Sync() error {
	s.flusher.Flush()
	if err := s.flushErr.Load(); err != nil {
		return *err
	}
	return s.writeStamps()
}

// Flushing reports whether the background flush is making blobs durable now.
func (s *Store) Flushing() bool { return s.flusher.Busy() }

// ObserveFlushes has fn told of every background flush of committed blobs (see Flusher.Observe).
func (s *Store) ObserveFlushes(fn func(items int, start time.Time, took time.Duration)) {
	s.flusher.Observe(fn)
}

// Close waits for background flushes (Sync); the Store stays usable.
func (s *Store) Close() error { return s.Sync() }

// Recovered reports what Open did about blobs that were not yet durable.
func (s *Store) Recovered() Recovery { return s.recovery }

// Quarantine moves a blob whose bytes are wrong out of the store, to quarantine/<alg>-<hex>, so that the next
// ingest fetches it again. The bad bytes are kept there for inspection until PurgeQuarantine.
func (s *Store) Quarantine(d digest.Digest) error {
	if err := d.Validate(); err != nil {
		return err
	}
	dir := filepath.Join(s.root, "quarantine")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	os.Remove(s.markPath(d))
	s.dropStamp(d)
	err := os.Rename(s.Path(d), filepath.Join(dir, d.Algorithm().String()+"-"+d.Encoded()))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// PurgeQuarantine deletes quarantined blobs and reports how many bytes it freed.
func (s *Store) PurgeQuarantine() (int64, error) {
	dir := filepath.Join(s.root, "quarantine")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var freed int64
	var errs []error
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			freed += info.Size()
		}
		errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
	}
	return freed, errors.Join(errs...)
}

// recoverDurability runs at Open: see the comment at the top of this file.
func (s *Store) recoverDurability() error {
	if err := os.MkdirAll(filepath.Join(s.root, "ingest", "durable"), 0o755); err != nil {
		return err
	}
	id, err := BootID()
	if err != nil {
		return err
	}
	boot := []byte(id)
	bootFile := filepath.Join(s.root, "ingest", "boot-id")
	last, err := os.ReadFile(bootFile)
	legacy := errors.Is(err, fs.ErrNotExist)
	if err != nil && !legacy {
		return err
	}
	s.recovery.BootChanged = !legacy && strings.TrimSpace(string(last)) != strings.TrimSpace(string(boot))
	var unmarked []digest.Digest
	if err := s.Walk(func(d digest.Digest, _ int64) error {
		if !s.Durable(d) {
			unmarked = append(unmarked, d)
		}
		return nil
	}); err != nil {
		return err
	}
	var flush []commit
	for _, d := range unmarked {
		c, _ := s.commits.Begin(d, nil) // unmarked already
		switch {
		case legacy:
		case s.recovery.BootChanged:
			s.recovery.Rehashed++
			err := s.Verify(d)
			if errors.Is(err, ErrDigestMismatch) {
				if err := s.Quarantine(d); err != nil {
					return err
				}
				s.forget(c)
				s.recovery.Quarantined = append(s.recovery.Quarantined, d)
				continue
			}
			if err != nil {
				return err
			}
		default:
			// Correct in the page cache. A blob written long enough ago has been written back by the kernel, so
			// its flush costs no more than a check and this Open marks it itself: a short-lived process (every
			// CLI command) exits before a background flush runs, and without this every model the CLI pulled
			// since the last long-lived process would be re-hashed after the next restart. A recent blob is left
			// to the background flush, so a command right after a pull does not wait for the pull's flush.
			s.recovery.Flushed++
			if settled(s.Path(d)) {
				break
			}
			s.flushLater(c)
			continue
		}
		flush = append(flush, c)
	}
	if err := s.makeDurable(flush); err != nil {
		return err
	}
	// Marks of blobs that are gone (a crash between a mark's and a blob's removal) would vouch for a future blob.
	marks, err := os.ReadDir(filepath.Join(s.root, "ingest", "durable"))
	if err != nil {
		return err
	}
	for _, m := range marks {
		alg, hex, _ := strings.Cut(m.Name(), "-")
		if _, err := os.Lstat(filepath.Join(s.root, "blobs", alg, hex)); errors.Is(err, fs.ErrNotExist) {
			os.Remove(filepath.Join(s.root, "ingest", "durable", m.Name()))
		}
	}
	// Only now, with every unmarked blob checked and durable, may this boot vouch for the rest.
	if strings.TrimSpace(string(last)) == strings.TrimSpace(string(boot)) {
		return nil
	}
	return writeBootID(bootFile, boot)
}

// BootID is the kernel's random id of this boot: what was written without a flush to disk is only trusted by a
// reader that finds the boot id it was written in.
func BootID() (string, error) {
	b, err := os.ReadFile(bootIDFile)
	if err != nil {
		return "", fmt.Errorf("read boot id: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// SettleTime is how long after its last write a blob is taken to have been written back by the kernel (which does
// it within vm.dirty_expire_centisecs, 30 s by default, plus a writeback interval of 5 s). A wrong guess only costs
// time: the flush is done either way.
var SettleTime = time.Minute

func settled(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && time.Since(fi.ModTime()) > SettleTime
}

// writeBootID records the boot id durably. It is not replaced atomically: a torn id reads as another boot, which
// only costs a re-hash.
func writeBootID(path string, id []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(id)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return diskio.SyncDir(filepath.Dir(path))
}

// DropPartial deletes the partial ingest of d (and its lock file) unless an ingest is writing it now; it reports
// whether it deleted one.
func (s *Store) DropPartial(d digest.Digest) (bool, error) {
	base := filepath.Join(s.root, "ingest", d.Algorithm().String()+"-"+d.Encoded())
	lock := flock.New(base + ".lock")
	ok, err := lock.TryLock()
	if err != nil || !ok {
		return false, err
	}
	defer lock.Unlock()
	err = os.Remove(base + ".partial")
	os.Remove(base + ".lock")
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// DropIngests deletes every partial ingest and lock file no ingest holds now (for a store's prune, when no other
// writer can be resuming them), and reports how many partials it deleted.
func (s *Store) DropIngests() (int, error) {
	dir := filepath.Join(s.root, "ingest")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".partial")
		if !ok {
			name, ok = strings.CutSuffix(e.Name(), ".lock")
		}
		alg, hex, _ := strings.Cut(name, "-")
		d := digest.NewDigestFromEncoded(digest.Algorithm(alg), hex)
		if !ok || d.Validate() != nil {
			continue
		}
		if dropped, _ := s.DropPartial(d); dropped {
			n++
		}
	}
	return n, nil
}

// PartialAge is how long ago each partial ingest was last written.
func (s *Store) PartialAge(now time.Time) (map[digest.Digest]time.Duration, error) {
	partials, err := s.Partials()
	if err != nil {
		return nil, err
	}
	out := map[digest.Digest]time.Duration{}
	for d := range partials {
		fi, err := os.Stat(filepath.Join(s.root, "ingest", d.Algorithm().String()+"-"+d.Encoded()+".partial"))
		if err == nil {
			out[d] = now.Sub(fi.ModTime())
		}
	}
	return out, nil
}
