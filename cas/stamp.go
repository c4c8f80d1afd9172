package cas

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	digest "github.com/opencontainers/go-digest"
)

// Stamps. A blob is verified when it enters, but its file can be written afterwards (a disk, a person, an attacker
// with `dd conv=notrunc`), through its name or through any hardlink of it (the cache's views). Re-hashing on every
// use would make a warm use cost the blob's size, so each commit records what identifies the bytes on disk
// cheaply: device, inode, size, mtime and ctime. Any write through the file system changes ctime, even when the
// writer restores mtime afterwards (touch -d), and ctime cannot be set from user space. Check compares a stat with
// the stamp; a difference means the bytes may have changed: they are re-hashed before use, and the stamp is
// recorded again if they are right.
//
// Link and unlink change ctime too. The store's own links and unlinks of a blob's inode (the cache's views) go
// through Link and Unlink, which carry the stamp over when it matched just before the operation: the only window a
// write can hide in is that system call's. They carry over, the same way, the stat a re-hash under way began from
// (check.base), which the re-hash compares with the stat after its read: a view linked or deleted while the blob
// is re-hashed (a publish and an unpublish after an unclean start, beside the scrub) is not taken for a write, so
// an intact blob is never called corrupt because the store itself linked it. A Link of a blob whose stamp holds
// goes ahead while the scrub re-hashes it; one of a suspect or changed blob waits for the re-hash.
//
// Stamps are kept in memory and in ingest/stamps/<alg>-<hex> (written at commit, and for later changes at Sync;
// never fsynced: a lost or torn stamp only costs a re-hash). A blob without a stamp (committed by an older
// version, or a crash between its commit and the stamp's write) is re-hashed at its first Check.
//
// Suspect marks every blob as needing a re-hash before its next use whatever its stamp (the cache does it after an
// unclean start); Check then re-hashes that one blob, or waits for the re-hash under way, and never passes it
// before. A stamp cannot see what bypasses the file system (a write to the block device, bit rot): the scrub
// (Scrub, driven by the cache) re-hashes every blob in the background for those.

// Stamp identifies the bytes of a file on disk cheaply.
type Stamp struct {
	Dev, Ino     uint64
	Size         int64
	Mtime, Ctime int64 // nanoseconds
}

// StampOf is the stamp of a stat result (the zero Stamp if the platform has no inode numbers).
func StampOf(fi fs.FileInfo) Stamp {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return Stamp{}
	}
	return Stamp{
		Dev: uint64(st.Dev), Ino: st.Ino, Size: st.Size,
		Mtime: st.Mtim.Sec*1e9 + st.Mtim.Nsec, Ctime: st.Ctim.Sec*1e9 + st.Ctim.Nsec,
	}
}

func (st Stamp) inode() [2]uint64 { return [2]uint64{st.Dev, st.Ino} }

func (st Stamp) String() string {
	return fmt.Sprintf("%d %d %d %d %d\n", st.Dev, st.Ino, st.Size, st.Mtime, st.Ctime)
}

func parseStamp(b []byte) (Stamp, bool) {
	var st Stamp
	n, err := fmt.Sscanf(string(b), "%d %d %d %d %d\n", &st.Dev, &st.Ino, &st.Size, &st.Mtime, &st.Ctime)
	return st, err == nil && n == 5 && st.Ino != 0
}

// checkHook, if set (tests), is told when a re-hash of a blob begins ("rehash", in the re-hashing goroutine,
// before it reads: a gate to hold it), when a pass of it has read the blob ("hashed", before it compares the
// stat with the one it began from) and when a Check or Scrub starts waiting for the re-hash under way ("wait").
var checkHook atomic.Pointer[func(d digest.Digest, event string)]

// SetCheckHookForTesting installs hook as checkHook; restore undoes it. Tests of packages built on cas gate
// re-hashes with it. Not for production use.
func SetCheckHookForTesting(hook func(d digest.Digest, event string)) (restore func()) {
	old := checkHook.Swap(&hook)
	return func() { checkHook.Store(old) }
}

func hookCheck(d digest.Digest, event string) {
	if hook := checkHook.Load(); hook != nil && *hook != nil {
		(*hook)(d, event)
	}
}

// check is one re-hash of a blob under way, which every Check of that blob waits for.
type check struct {
	done chan struct{}
	err  error
	st   Stamp // the stamp recorded, when err is nil
	// base is the stamp of the file as the current pass of the re-hash began, carried over the store's own links
	// and unlinks since (carryLocked); set once based. Both under stampMu.
	base  Stamp
	based bool
	// urgent is closed once a use waits for it: a paced re-hash (the scrub) stops pacing itself, at once.
	urgent     chan struct{}
	urgentOnce sync.Once
}

func (ck *check) hurry() { ck.urgentOnce.Do(func() { close(ck.urgent) }) }

func (s *Store) stampPath(d digest.Digest) string {
	return filepath.Join(s.root, "ingest", "stamps", d.Algorithm().String()+"-"+d.Encoded())
}

// loadStamps reads the recorded stamps at Open and drops those of blobs that are gone.
func (s *Store) loadStamps() error {
	dir := filepath.Join(s.root, "ingest", "stamps")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	s.stampMu.Lock()
	defer s.stampMu.Unlock()
	for _, e := range entries {
		alg, hex, _ := strings.Cut(e.Name(), "-")
		d := digest.NewDigestFromEncoded(digest.Algorithm(alg), hex)
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		st, ok := parseStamp(b)
		if d.Validate() != nil || err != nil || !ok {
			os.Remove(filepath.Join(dir, e.Name()))
			continue
		}
		if _, err := os.Lstat(s.Path(d)); errors.Is(err, fs.ErrNotExist) {
			os.Remove(filepath.Join(dir, e.Name()))
			continue
		}
		s.setStampLocked(d, st)
		delete(s.dirty, d)
	}
	return nil
}

// setStampLocked records d's stamp in memory; Sync writes it out. The caller holds stampMu.
func (s *Store) setStampLocked(d digest.Digest, st Stamp) {
	if old, ok := s.stamps[d]; ok && s.inodes[old.inode()] == d {
		delete(s.inodes, old.inode())
	}
	s.stamps[d] = st
	s.inodes[st.inode()] = d
	s.dirty[d] = true
}

// dropStamp forgets d's stamp (the blob is deleted or quarantined).
func (s *Store) dropStamp(d digest.Digest) {
	s.stampMu.Lock()
	if old, ok := s.stamps[d]; ok && s.inodes[old.inode()] == d {
		delete(s.inodes, old.inode())
	}
	delete(s.stamps, d)
	delete(s.dirty, d)
	delete(s.suspect, d)
	s.stampMu.Unlock()
	os.Remove(s.stampPath(d))
}

// stampCommitted records the stamp of a blob just renamed into place, on disk at once: a short-lived process (a
// CLI command) exits before a Sync would run.
func (s *Store) stampCommitted(d digest.Digest) error {
	fi, err := os.Stat(s.Path(d))
	if err != nil {
		return err
	}
	st := StampOf(fi)
	s.stampMu.Lock()
	s.setStampLocked(d, st)
	delete(s.dirty, d)
	delete(s.suspect, d)
	s.stampMu.Unlock()
	return os.WriteFile(s.stampPath(d), []byte(st.String()), 0o644)
}

// writeStamps writes the stamps changed since the last write (Sync).
func (s *Store) writeStamps() error {
	s.stampMu.Lock()
	out := make(map[digest.Digest]Stamp, len(s.dirty))
	for d := range s.dirty {
		out[d] = s.stamps[d]
	}
	clear(s.dirty)
	s.stampMu.Unlock()
	var errs []error
	for d, st := range out {
		if _, err := os.Lstat(s.Path(d)); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		errs = append(errs, os.WriteFile(s.stampPath(d), []byte(st.String()), 0o644))
	}
	return errors.Join(errs...)
}

// SuspectAll marks every blob present as needing a re-hash before its next Check passes, whatever its stamp.
func (s *Store) SuspectAll() error {
	return s.Walk(func(d digest.Digest, _ int64) error {
		s.stampMu.Lock()
		s.suspect[d] = true
		s.stampMu.Unlock()
		return nil
	})
}

// Suspects reports how many blobs still wait for their re-hash (SuspectAll).
func (s *Store) Suspects() int {
	s.stampMu.Lock()
	defer s.stampMu.Unlock()
	return len(s.suspect)
}

// Check confirms that the bytes of blob d are still those that were verified, and returns its size: a stat
// compared with its stamp, and only when they differ (or d is suspect) a re-hash, shared with any re-hash of d
// under way. ErrDigestMismatch means the bytes are wrong: the caller quarantines the blob.
func (s *Store) Check(d digest.Digest) (int64, error) {
	if err := d.Validate(); err != nil {
		return 0, err
	}
	for {
		fi, err := os.Stat(s.Path(d))
		if errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("%s: %w", d, ErrNotFound)
		}
		if err != nil {
			return 0, err
		}
		s.stampMu.Lock()
		rec, ok := s.stamps[d]
		if ok && rec == StampOf(fi) && !s.suspect[d] {
			s.stampMu.Unlock()
			return fi.Size(), nil
		}
		if ok && rec.Size != fi.Size() {
			// A blob's size is fixed by its digest: no need to hash to know these bytes are wrong.
			s.stampMu.Unlock()
			return fi.Size(), fmt.Errorf("%s: %w: %d bytes, %d when verified", d, ErrSizeMismatch, fi.Size(), rec.Size)
		}
		ck, lead := s.beginCheckLocked(d)
		ck.hurry()
		s.stampMu.Unlock()
		err = s.await(d, ck, lead, nil)
		if errors.Is(err, errScrubStopped) {
			continue
		}
		if err != nil {
			return 0, err
		}
		// The re-hash read these bytes right, and the file did not change (but for the store's own links) from
		// the start of its read to the stamp it recorded.
		return ck.st.Size, nil
	}
}

// await runs the re-hash ck of d at pace when the caller leads it, or waits for the one under way, and returns
// its verdict.
func (s *Store) await(d digest.Digest, ck *check, lead bool, pace Pace) error {
	if lead {
		s.rehash(d, ck, pace)
	} else {
		hookCheck(d, "wait")
	}
	<-ck.done
	return ck.err
}

// beginCheckLocked returns the re-hash of d under way, or a new one that the caller (lead) must run. The caller holds
// stampMu.
func (s *Store) beginCheckLocked(d digest.Digest) (ck *check, lead bool) {
	if ck := s.checks[d]; ck != nil {
		return ck, false
	}
	ck = &check{done: make(chan struct{}), urgent: make(chan struct{})}
	s.checks[d] = ck
	return ck, true
}

// rehash re-hashes d, paced by pace (nil: at full speed) until a use waits for it, records its stamp if its bytes
// are right, and ends ck.
func (s *Store) rehash(d digest.Digest, ck *check, pace Pace) {
	hookCheck(d, "rehash")
	var err error
	for range 3 {
		// The stat and the comparison below are made under stampMu, as the store's own links are, so that each of
		// those falls wholly before, between (carried over base) or after them.
		s.stampMu.Lock()
		before, serr := os.Stat(s.Path(d))
		if serr == nil {
			ck.base, ck.based = StampOf(before), true
		}
		s.stampMu.Unlock()
		if err = serr; err != nil {
			break
		}
		if err = s.hash(d, func(n int) error {
			if pace == nil {
				return nil
			}
			if err := pace(n, ck.urgent); err != nil {
				return fmt.Errorf("%w: %w", errScrubStopped, err)
			}
			return nil
		}); err != nil {
			break
		}
		hookCheck(d, "hashed")
		s.stampMu.Lock()
		after, serr := os.Stat(s.Path(d))
		if serr == nil && StampOf(after) == ck.base {
			// Right, and unchanged since the read began: recorded before any other link can change it.
			ck.st = StampOf(after)
			s.setStampLocked(d, ck.st)
			delete(s.suspect, d)
			s.endCheckLocked(d, ck, nil)
			s.stampMu.Unlock()
			return
		}
		s.stampMu.Unlock()
		if err = serr; err != nil {
			break
		}
		// Changed by someone else (a write) while it was read: once more, so the stamp recorded is that of the
		// bytes hashed.
		err = fmt.Errorf("%s: %w: its file changed while it was re-hashed", d, ErrDigestMismatch)
	}
	if errors.Is(err, fs.ErrNotExist) {
		err = fmt.Errorf("%s: %w", d, ErrNotFound)
	}
	s.stampMu.Lock()
	s.endCheckLocked(d, ck, err)
	s.stampMu.Unlock()
}

// endCheckLocked ends re-hash ck of d with its verdict. The caller holds stampMu.
func (s *Store) endCheckLocked(d digest.Digest, ck *check, err error) {
	delete(s.checks, d)
	ck.err = err
	close(ck.done)
}

// errScrubStopped: a paced re-hash stopped because its pace said so (the scrub's context ended); it says nothing
// about the blob, and a Check that joined it checks again.
var errScrubStopped = errors.New("re-hash stopped")

// hash reads blob d through its digest's hash and reports ErrDigestMismatch if they differ; pace is called after
// each chunk read, and an error from it stops the read.
func (s *Store) hash(d digest.Digest, pace func(n int) error) error {
	f, err := s.Open(d)
	if err != nil {
		return err
	}
	defer f.Close()
	v := d.Verifier()
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	for {
		n, err := f.Read(*buf)
		if n > 0 {
			v.Write((*buf)[:n])
			if err := pace(n); err != nil {
				return err
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if !v.Verified() {
		return fmt.Errorf("%s: %w", d, ErrDigestMismatch)
	}
	return nil
}

// Pace is a scrub's throttle, called after each chunk of n bytes re-hashed: it may wait, but must return at once
// when urgent is closed (a use waits for this blob); an error from it stops the re-hash.
type Pace func(n int, urgent <-chan struct{}) error

// Scrub re-hashes blob d whatever its stamp, paced by pace (nil: at full speed), and records its stamp if its bytes
// are right. A re-hash of d already under way is joined instead.
func (s *Store) Scrub(d digest.Digest, pace Pace) error {
	if err := d.Validate(); err != nil {
		return err
	}
	s.stampMu.Lock()
	ck, lead := s.beginCheckLocked(d)
	s.stampMu.Unlock()
	return s.await(d, ck, lead, pace)
}

// Link hardlinks blob d at dst (the cache's views), its stamp checked right before (a re-hash first if it changed,
// or the wait for the re-hash under way if it is suspect) and carried over the link's change of ctime.
func (s *Store) Link(d digest.Digest, dst string) error {
	for range 3 {
		linked, err := s.relinkIfStamped(d, func() error { return os.Link(s.Path(d), dst) })
		if linked || err != nil {
			return err
		}
		if _, err := s.Check(d); err != nil {
			return err
		}
	}
	// Re-hashed right each time, and changed by someone else each time since.
	return fmt.Errorf("%s: %w: its file keeps changing", d, ErrDigestMismatch)
}

// relinkIfStamped runs op and carries d's stamp over it only if the stamp matches right before and d is not
// suspect; otherwise it does nothing and reports false.
func (s *Store) relinkIfStamped(d digest.Digest, op func() error) (bool, error) {
	s.stampMu.Lock()
	defer s.stampMu.Unlock()
	fi, err := os.Stat(s.Path(d))
	if errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("%s: %w", d, ErrNotFound)
	}
	if err != nil {
		return false, err
	}
	rec, ok := s.stamps[d]
	if !ok || rec != StampOf(fi) || s.suspect[d] {
		return false, nil
	}
	return true, s.carryLocked(d, fi, op)
}

// Unlink removes path and reports whether it was a hardlink of a blob, whose stamp it then carries over the change
// of ctime. A path that is no blob's is left alone (false, nil).
func (s *Store) Unlink(path string) (bool, error) {
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return false, err
	}
	s.stampMu.Lock()
	defer s.stampMu.Unlock()
	d, ok := s.inodes[StampOf(fi).inode()]
	if !ok {
		return false, nil
	}
	cur, err := os.Stat(s.Path(d))
	if err != nil {
		return true, os.Remove(path)
	}
	return true, s.carryLocked(d, cur, func() error { return os.Remove(path) })
}

// carryLocked runs op, which changes the link count of d's inode (cur is d's stat right before), and carries over
// its change of ctime whatever matched cur: d's stamp (unless d is suspect) and the base of a re-hash of d under
// way. op's own system call is the only moment a write could go unseen. The caller holds stampMu.
func (s *Store) carryLocked(d digest.Digest, cur fs.FileInfo, op func() error) error {
	was := StampOf(cur)
	rec, ok := s.stamps[d]
	stamp := ok && rec == was && !s.suspect[d]
	ck := s.checks[d]
	base := ck != nil && ck.based && ck.base == was
	if err := op(); err != nil {
		return err
	}
	fi, err := os.Stat(s.Path(d))
	if err != nil {
		return nil // the next Check finds what happened
	}
	now := StampOf(fi)
	if stamp {
		s.setStampLocked(d, now)
	}
	if base {
		ck.base = now
	}
	return nil
}
