// Package cas is a directory of blobs addressed by digest, laid out as an OCI image layout's blobs/ tree.
//
// Every byte enters through Ingest or Write: a streaming write into a private temporary file that checks size and
// digest as it goes, then an atomic rename to blobs/<alg>/<hex>. A blob under its final name is therefore always
// complete and correct; partial ingests live under ingest/ and are never read as content. The rename does not wait
// for the disk: blobs are flushed in the background and marked durable when the flush completed, and Open
// re-hashes unmarked blobs after a restart of the machine (durable.go). Ingests of the same
// digest are coalesced within a process (singleflight) and serialised across processes (a file lock), and a partial
// ingest left by a crash or a dropped connection resumes where it stopped.
//
// Verifier (verify.go) is the project's one check of bytes against a descriptor's size and digest: the ingest uses
// it, and so does every other reader of blobs (fetch, unpack, pack from the Hub, documents read into memory).
package cas

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/flock"
	digest "github.com/opencontainers/go-digest"
	"golang.org/x/sync/singleflight"

	"github.com/modelpack/modelpack/internal/diskio"
	"github.com/modelpack/modelpack/internal/errdef"
)

// Errors callers can test with errors.Is (the project's shared causes, see internal/errdef).
var (
	ErrNotFound       = errdef.ErrNotFound
	ErrSizeMismatch   = errdef.ErrSizeMismatch
	ErrDigestMismatch = errdef.ErrDigestMismatch
	// ErrIncomplete: reading the source failed part way; the partial is kept and the next Ingest resumes it.
	ErrIncomplete = errdef.ErrIncomplete
)

// Store is a content-addressed blob directory rooted at Root.
type Store struct {
	root   string
	flight singleflight.Group

	flusher   *Flusher[commit]        // makes committed blobs durable (durable.go)
	delay     atomic.Int64            // the flush delay, when SetFlushDelay set one
	flushErr  atomic.Pointer[error]   // the first flush error
	ingesting atomic.Int32            // ingests under way: the flusher waits for them
	commits   Versions[digest.Digest] // commits not yet marked durable
	recovery  Recovery

	// stamps (stamp.go), under stampMu: what identifies each blob's bytes on disk, the blob of each inode, the
	// stamps not yet written out, the blobs to re-hash before their next use, and the re-hashes under way.
	stampMu sync.Mutex
	stamps  map[digest.Digest]Stamp
	inodes  map[[2]uint64]digest.Digest
	dirty   map[digest.Digest]bool
	suspect map[digest.Digest]bool
	checks  map[digest.Digest]*check
}

// Open opens (creating if needed) a store rooted at root.
func Open(root string) (*Store, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{filepath.Join(abs, "blobs", "sha256"), filepath.Join(abs, "ingest")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("create blob store: %w", err)
		}
	}
	s := &Store{root: abs, stamps: map[digest.Digest]Stamp{}, inodes: map[[2]uint64]digest.Digest{},
		dirty: map[digest.Digest]bool{}, suspect: map[digest.Digest]bool{}, checks: map[digest.Digest]*check{}}
	s.flusher = NewFlusher(s, s.flushBatch)
	if err := s.loadStamps(); err != nil {
		return nil, fmt.Errorf("open blob store %s: %w", abs, err)
	}
	if err := s.recoverDurability(); err != nil {
		return nil, fmt.Errorf("recover blob store %s: %w", abs, err)
	}
	return s, nil
}

// Root is the store's directory.
func (s *Store) Root() string { return s.root }

// Path is where the blob with digest d lives (whether or not it exists).
func (s *Store) Path(d digest.Digest) string {
	return filepath.Join(s.root, "blobs", d.Algorithm().String(), d.Encoded())
}

// Stat returns the size of a committed blob, or ErrNotFound.
func (s *Store) Stat(d digest.Digest) (int64, error) {
	if err := d.Validate(); err != nil {
		return 0, err
	}
	fi, err := os.Stat(s.Path(d))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("%s: %w", d, ErrNotFound)
	}
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// Exists reports whether a committed blob of digest d and the given size is present.
func (s *Store) Exists(d digest.Digest, size int64) (bool, error) {
	n, err := s.Stat(d)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return n == size, nil
}

// Open opens a committed blob for reading.
func (s *Store) Open(d digest.Digest) (*os.File, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	f, err := os.Open(s.Path(d))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", d, ErrNotFound)
	}
	return f, err
}

// Delete removes a committed blob. Deleting an absent blob is not an error.
func (s *Store) Delete(d digest.Digest) error {
	if err := d.Validate(); err != nil {
		return err
	}
	// The mark and the stamp go first: either, without its blob, would vouch for the next blob of that digest.
	if err := os.Remove(s.markPath(d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	s.dropStamp(d)
	if err := os.Remove(s.Path(d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Walk calls fn for every committed blob.
func (s *Store) Walk(fn func(d digest.Digest, size int64) error) error {
	algs, err := os.ReadDir(filepath.Join(s.root, "blobs"))
	if err != nil {
		return err
	}
	for _, alg := range algs {
		entries, err := os.ReadDir(filepath.Join(s.root, "blobs", alg.Name()))
		if err != nil {
			return err
		}
		for _, e := range entries {
			d := digest.NewDigestFromEncoded(digest.Algorithm(alg.Name()), e.Name())
			if d.Validate() != nil {
				continue
			}
			info, err := e.Info()
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				return err
			}
			if err := fn(d, info.Size()); err != nil {
				return err
			}
		}
	}
	return nil
}

// Verify re-hashes a committed blob at full speed and reports ErrDigestMismatch if its bytes no longer match its
// name; right, its stamp is recorded again.
func (s *Store) Verify(d digest.Digest) error { return s.Scrub(d, nil) }

// OpenFunc opens the source of a blob at offset. It returns the offset its reader really starts at: offset when the
// source can seek (an HTTP Range request), 0 when it can only start over.
type OpenFunc func(ctx context.Context, offset int64) (rc io.ReadCloser, start int64, err error)

// Ingest commits the blob d of the given size from open, unless it is already present. Concurrent calls for one
// digest, in this process or others, result in one transfer. A partial ingest from an earlier attempt is resumed.
// On a size or digest mismatch the bytes are dropped and nothing is committed.
func (s *Store) Ingest(ctx context.Context, d digest.Digest, size int64, open OpenFunc) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("invalid digest %q: %w", d, err)
	}
	if size < 0 {
		return fmt.Errorf("invalid size %d for %s", size, d)
	}
	for {
		// The shared call runs under the context of the caller that started it. If that caller gave up, the
		// others, still wanting the blob, try again (resuming the partial) rather than inherit its cancellation.
		// Callers agreeing on the digest but not on the size must not share an answer: the key holds both.
		key := fmt.Sprintf("%s/%d", d, size)
		ch := s.flight.DoChan(key, func() (any, error) {
			err := s.ingest(ctx, d, size, open)
			if errors.Is(err, errBadResume) {
				// The partial was dropped: once more, from the first byte.
				err = s.ingest(ctx, d, size, open)
			}
			return ctx, err
		})
		if flightHook != nil {
			flightHook(key)
		}
		r := <-ch
		v, err := r.Val, r.Err
		if err != nil && ctx.Err() == nil && isCancellation(err) {
			if lead, _ := v.(context.Context); lead != nil && lead != ctx && lead.Err() != nil {
				continue
			}
		}
		return err
	}
}

func isCancellation(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

func (s *Store) ingest(ctx context.Context, d digest.Digest, size int64, open OpenFunc) error {
	if ok, err := s.Exists(d, size); err != nil || ok {
		return err
	}
	s.ingesting.Add(1)
	defer s.ingesting.Add(-1)
	base := filepath.Join(s.root, "ingest", d.Algorithm().String()+"-"+d.Encoded())
	lock, err := lockIngest(ctx, base+".lock")
	if err != nil {
		return fmt.Errorf("lock ingest of %s: %w", d, err)
	}
	committed := false
	defer func() {
		// The lock file goes with the ingest it served; one left by a failure is kept for the resume.
		if committed {
			os.Remove(base + ".lock")
		}
		lock.Unlock()
	}()
	// Another process may have committed it while we waited for the lock.
	if ok, err := s.Exists(d, size); err != nil || ok {
		committed = ok
		return err
	}
	partial := base + ".partial"
	if err := download(ctx, partial, NewVerifier(d, size), open); err != nil {
		return err
	}
	committed = true
	return s.commit(partial, d)
}

// download makes the file partial hold the blob v checks: it keeps what an earlier attempt left there, fetches the
// rest from open and verifies the whole. On an error the partial is kept when the next attempt can resume it (a
// cancellation, a dropped connection) and removed when its bytes are wrong.
func download(ctx context.Context, partial string, v *Verifier, open OpenFunc) error {
	d, size := v.d, v.size
	f, err := os.OpenFile(partial, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := v.Resume(f); err != nil {
		return err
	}
	resumed := v.Written()
	if resumed == size && size > 0 {
		// A crash after the last byte but before the commit: the partial may already be the blob, and asking the
		// source for a range starting at its end is an error (416).
		if v.Check() == nil {
			return nil
		}
		if err := startOver(f, v); err != nil {
			return err
		}
	}
	// Reserving the blob's blocks before the first request: a disk that cannot hold it fails now, not after
	// gigabytes, and the writes below skip per-page block reservation.
	if err := diskio.Preallocate(f, size); err != nil {
		if v.Written() == 0 {
			os.Remove(partial)
		} else {
			f.Truncate(v.Written()) // gives back what the reservation took past the kept bytes
		}
		return fmt.Errorf("ingest %s (%d bytes): %w", d, size, err)
	}
	offset := v.Written()
	rc, start, err := open(ctx, offset)
	if err != nil {
		return err
	}
	defer rc.Close()
	if start != offset {
		if start != 0 {
			return fmt.Errorf("source of %s resumed at %d, want %d or 0", d, start, offset)
		}
		if err := startOver(f, v); err != nil {
			return err
		}
	}
	// Read one byte more than expected so an oversized source is caught rather than truncated. The bytes go to the
	// page cache only: starting their writeback here (sync_file_range, as this once did) put block allocation and
	// I/O submission on the download's CPU (README, Performance); the flush is the flusher's.
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	_, err = io.CopyBuffer(io.MultiWriter(v, f), io.LimitReader(ctxReader{ctx, rc}, size-v.Written()+1), *buf)
	kept := int64(0)
	if start == resumed {
		kept = resumed
	}
	return settle(ctx, partial, v, err, kept)
}

// settle decides what a finished copy into partial leaves: nil when the bytes are the blob; otherwise an error,
// with the partial removed unless it may only have been cut off. The copy continued the first kept bytes an
// earlier attempt wrote (0: it started afresh).
func settle(ctx context.Context, partial string, v *Verifier, copyErr error, kept int64) error {
	d, size := v.d, v.size
	if copyErr != nil {
		switch {
		case errors.Is(copyErr, ErrDigestMismatch):
			// The source itself says its bytes are not the blob (it checks what it serves): nothing to resume.
			os.Remove(partial)
			return fmt.Errorf("fetch %s: %w", d, copyErr)
		case ctx.Err() == nil:
			// The partial is kept: the next Ingest resumes it.
			return fmt.Errorf("fetch %s: %w: %w", d, ErrIncomplete, copyErr)
		}
		return fmt.Errorf("fetch %s: %w", d, copyErr)
	}
	err := v.Check()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrSizeMismatch) && v.Written() < size:
		// A stream that ends cleanly short of size says the blob is shorter than its descriptor (a dropped
		// connection is an error, above). The partial stays in case it was only cut off.
		return fmt.Errorf("%s: %w", d, err)
	}
	os.Remove(partial)
	if errors.Is(err, ErrDigestMismatch) && kept > 0 {
		// The kept part may be what broke the digest (a power loss can leave zeros where unflushed bytes were).
		return fmt.Errorf("%s: %w after resuming at %d: %w", d, err, kept, errBadResume)
	}
	return fmt.Errorf("%s: %w; the bytes were dropped", d, err)
}

// lockIngest takes the cross-process lock of one digest's ingest. Lock files are removed when their ingest
// commits, so a lock taken on a file that was meanwhile unlinked (or replaced) guards nothing: take it again.
func lockIngest(ctx context.Context, path string) (*flock.Flock, error) {
	for {
		lock := flock.New(path)
		if _, err := lock.TryLockContext(ctx, lockRetry); err != nil {
			return nil, err
		}
		held, herr := lock.Stat()
		named, nerr := os.Stat(path)
		if herr == nil && nerr == nil && os.SameFile(held, named) {
			return lock, nil
		}
		lock.Unlock()
		if herr != nil {
			return nil, herr
		}
	}
}

// startOver empties a partial file whose bytes cannot be kept, and v with it.
func startOver(f *os.File, v *Verifier) error {
	v.Reset()
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.Seek(0, io.SeekStart)
	return err
}

// Write commits a blob whose digest is not known in advance, hashing and writing it in one pass.
func (s *Store) Write(ctx context.Context, r io.Reader) (digest.Digest, int64, error) {
	f, err := os.CreateTemp(filepath.Join(s.root, "ingest"), "write-*.partial")
	if err != nil {
		return "", 0, err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		f.Close()
		if !ok {
			os.Remove(tmp)
		}
	}()
	digester := digest.Canonical.Digester()
	n, err := io.Copy(io.MultiWriter(f, digester.Hash()), ctxReader{ctx, r})
	if err != nil {
		return "", 0, err
	}
	d := digester.Digest()
	if exists, err := s.Exists(d, n); err != nil {
		return "", 0, err
	} else if exists {
		return d, n, nil
	}
	if err := s.commit(tmp, d); err != nil {
		return "", 0, err
	}
	ok = true
	return d, n, nil
}

// commit names verified bytes; they become durable in the background (flushLater).
func (s *Store) commit(tmp string, d digest.Digest) error {
	dst := s.Path(d)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o444); err != nil {
		return err
	}
	// A stale mark (a crash between Delete's two removals, a flush of earlier bytes of d) must not vouch for these.
	c, err := s.unmark(d)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	s.flushLater(c)
	return s.stampCommitted(d)
}

// Recover deletes the temporaries of interrupted Writes, which cannot resume. Resumable partials are kept.
// Call it at start-up, before any Write.
func (s *Store) Recover() error {
	dir := filepath.Join(s.root, "ingest")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, "write-") {
			os.Remove(filepath.Join(dir, name))
		}
	}
	return nil
}

// Partials reports the bytes held by resumable partial ingests.
func (s *Store) Partials() (map[digest.Digest]int64, error) {
	dir := filepath.Join(s.root, "ingest")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[digest.Digest]int64{}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".partial")
		if !ok || strings.HasPrefix(name, "write-") {
			continue
		}
		alg, hex, ok := strings.Cut(name, "-")
		if !ok {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		out[digest.NewDigestFromEncoded(digest.Algorithm(alg), hex)] = info.Size()
	}
	return out, nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

const lockRetry = 20 * time.Millisecond

// flightHook, if set (tests), runs once a caller of Ingest has started or joined the shared ingest of its key.
var flightHook func(key string)

// errBadResume marks a digest mismatch of a resumed ingest, which Ingest retries once from the start.
var errBadResume = errors.New("the resumed partial was dropped")

// copyBuffers hold the buffers of ingests. io.Copy's 32 KiB costs a read, a write and a hash call per 32 KiB, which
// shows on multi-GB blobs. Of 256 KiB and 1 MiB, the driver's cold publish met its targets with 256 KiB only, while
// a CLI pull alone was a little faster with 1 MiB (README, Performance): the node's path decides.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}
