package cas

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelpack/modelpack/internal/diskio"
)

// Flusher makes things durable in the background, in batches. Each Add restarts a countdown of the store's flush
// delay (FlushDelay unless SetFlushDelay changed it); when it runs out while no ingest of the store is under way,
// one call of the flush function takes everything added since the previous call. A flush therefore never covers
// an item added after it started: whoever writes a mark for an item after its flush knows the flush began after
// the item was complete. The store's blobs use one, and so does the cache for the layers it extracts on the same
// disk.
type Flusher[T any] struct {
	store *Store
	flush func([]T)

	serial  sync.Mutex  // one batch at a time: the next takes everything added meanwhile
	busy    atomic.Bool // a batch is being flushed
	mu      sync.Mutex
	pending []T
	timer   *time.Timer
	observe atomic.Pointer[func(items int, start time.Time, took time.Duration)]
}

// NewFlusher returns a Flusher that hands batches to flush, waiting while s ingests (a flush under way would put
// its writes on a download's path).
func NewFlusher[T any](s *Store, flush func([]T)) *Flusher[T] {
	return &Flusher[T]{store: s, flush: flush}
}

// Add schedules items to be flushed in the background.
func (f *Flusher[T]) Add(items ...T) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending = append(f.pending, items...)
	if f.timer == nil {
		f.timer = time.AfterFunc(f.store.flushDelay(), f.whenIdle)
	} else {
		f.timer.Reset(f.store.flushDelay())
	}
}

// whenIdle is the countdown's end: with an ingest under way it counts down again.
func (f *Flusher[T]) whenIdle() {
	if f.store.ingesting.Load() > 0 {
		f.mu.Lock()
		if f.timer != nil {
			f.timer.Reset(f.store.flushDelay())
		}
		f.mu.Unlock()
		return
	}
	// The background flush runs on a thread of the idle I/O class: its writes wait for the disk to have nothing
	// else to do, so a publish's own small fsync (its volume record, its metadata) is not queued behind gigabytes
	// of write-back. The thread is never unlocked: it leaves with the goroutine, its class with it.
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		_ = diskio.Background() // best effort: where classes are not honoured the flush merely competes
		f.Flush()
	}()
	<-done
}

// Flush flushes everything added so far, as one batch, after the batch under way if there is one.
func (f *Flusher[T]) Flush() {
	f.serial.Lock()
	defer f.serial.Unlock()
	f.mu.Lock()
	batch := f.pending
	f.pending = nil
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
	f.mu.Unlock()
	if len(batch) > 0 {
		f.busy.Store(true)
		defer f.busy.Store(false)
		start := time.Now()
		f.flush(batch)
		if fn := f.observe.Load(); fn != nil {
			(*fn)(len(batch), start, time.Since(start))
		}
	}
}

// Observe has fn told of every batch flushed from now on: how many items, when it began, how long it took. The
// driver's phase log places the flush beside the pods it may compete with.
func (f *Flusher[T]) Observe(fn func(items int, start time.Time, took time.Duration)) {
	f.observe.Store(&fn)
}

// Busy reports whether a batch is being flushed now.
func (f *Flusher[T]) Busy() bool { return f.busy.Load() }

// Versions tells apart successive versions of what is written under one key (a blob deleted and committed again, a
// layer deleted and extracted again), so that the flush of one version never marks a later one durable. Begin and
// Mark run under one lock: a Mark of an earlier version either comes before Begin, which then drops the mark it
// wrote, or sees the later version and writes nothing. The zero value is ready to use.
type Versions[K comparable] struct {
	mu     sync.Mutex
	last   uint64
	latest map[K]uint64 // versions not yet marked
}

// Version is one version of what is written under Key.
type Version[K comparable] struct {
	Key K
	n   uint64
}

// Begin starts a new version of k, before it becomes visible under its name, and runs unmark (which drops k's
// mark; nil when the caller's own transaction does) under the lock.
func (v *Versions[K]) Begin(k K, unmark func() error) (Version[K], error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.latest == nil {
		v.latest = map[K]uint64{}
	}
	v.last++
	v.latest[k] = v.last
	ver := Version[K]{k, v.last}
	if unmark == nil {
		return ver, nil
	}
	return ver, unmark()
}

// Mark runs mark (which writes ver's mark) under the lock if ver is still the latest version of its key; a later
// version's own flush marks that one.
func (v *Versions[K]) Mark(ver Version[K], mark func() error) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.latest[ver.Key] != ver.n {
		return nil
	}
	delete(v.latest, ver.Key)
	return mark()
}
