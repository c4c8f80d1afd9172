package cas

import (
	"sync"
	"time"
)

// Flusher makes things durable in the background, in batches. Each Add restarts a countdown of FlushDelay; when it
// runs out while no ingest of the store is under way, one call of the flush function takes everything added
// since the previous call. A flush therefore never covers an item added after it started: whoever writes a mark
// for an item after its flush knows the flush began after the item was complete. The store's blobs use one, and so
// does the cache for the layers it extracts on the same disk.
type Flusher[T any] struct {
	store *Store
	flush func([]T)

	mu       sync.Mutex
	pending  []T
	timer    *time.Timer
	running  int        // batches taken and not yet flushed
	finished *sync.Cond // signalled when running drops
}

// NewFlusher returns a Flusher that hands batches to flush, waiting while s ingests (a flush under way would put
// its writes on a download's path).
func NewFlusher[T any](s *Store, flush func([]T)) *Flusher[T] {
	f := &Flusher[T]{store: s, flush: flush}
	f.finished = sync.NewCond(&f.mu)
	return f
}

// Add schedules items to be flushed in the background.
func (f *Flusher[T]) Add(items ...T) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending = append(f.pending, items...)
	if f.timer == nil {
		f.timer = time.AfterFunc(FlushDelay, f.whenIdle)
	} else {
		f.timer.Reset(FlushDelay)
	}
}

// whenIdle is the countdown's end: with an ingest under way it counts down again.
func (f *Flusher[T]) whenIdle() {
	if f.store.ingesting.Load() > 0 {
		f.mu.Lock()
		if f.timer != nil {
			f.timer.Reset(FlushDelay)
		}
		f.mu.Unlock()
		return
	}
	f.flushPending()
}

// flushPending flushes everything added so far, as one batch.
func (f *Flusher[T]) flushPending() {
	f.mu.Lock()
	batch := f.pending
	f.pending = nil
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
	if len(batch) == 0 {
		f.mu.Unlock()
		return
	}
	f.running++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.running--
		f.finished.Broadcast()
		f.mu.Unlock()
	}()
	f.flush(batch)
}

// Flush flushes everything added so far now, and waits for the batches already being flushed.
func (f *Flusher[T]) Flush() {
	f.flushPending()
	f.mu.Lock()
	for f.running > 0 {
		f.finished.Wait()
	}
	f.mu.Unlock()
}
