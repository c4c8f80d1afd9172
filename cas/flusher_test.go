package cas

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A background flush writes at the idle I/O class, so that a publish's own fsync is not queued behind it; a Flush
// asked for by a caller (Sync, shutdown) runs at the caller's class.
func TestBackgroundFlushRunsAtIdleIOClass(t *testing.T) {
	s := open(t)
	classOf := func() int {
		// ioprio_get(IOPRIO_WHO_PROCESS, 0): the calling thread's class, in the bits above 13.
		v, _, errno := unix.Syscall(unix.SYS_IOPRIO_GET, 1, 0, 0)
		if errno != 0 {
			t.Errorf("ioprio_get: %v", errno)
		}
		return int(v) >> 13
	}
	got := make(chan int, 2)
	f := NewFlusher(s, func(batch []int) { got <- classOf() })
	defer func(d time.Duration) { FlushDelay = d }(FlushDelay)
	FlushDelay = time.Millisecond

	f.Add(1) // the countdown's end flushes it in the background
	if c := <-got; c != 3 {
		t.Errorf("background flush ran at I/O class %d, want 3 (idle)", c)
	}
	FlushDelay = time.Hour
	f.Add(2)
	f.Flush()
	if c := <-got; c == 3 {
		t.Error("a Flush the caller asked for ran at the idle class")
	}
}

// The driver's phase log learns of each batch flushed, with its size and timing; an empty Flush is no batch.
func TestFlushesAreObserved(t *testing.T) {
	defer func(d time.Duration) { FlushDelay = d }(FlushDelay)
	FlushDelay = time.Hour // only the Syncs below flush
	s := open(t)
	type seen struct {
		items int
		start time.Time
		took  time.Duration
	}
	var got []seen
	s.ObserveFlushes(func(items int, start time.Time, took time.Duration) { got = append(got, seen{items, start, took}) })
	before := time.Now()
	ingest(t, s, blob(1<<20))
	ingest(t, s, blob(2<<20))
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil { // nothing left to flush
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].items != 2 {
		t.Fatalf("observed %+v, want one batch of the 2 blobs", got)
	}
	if got[0].start.Before(before) || got[0].took <= 0 || time.Since(got[0].start) < got[0].took {
		t.Errorf("batch timed %+v, outside the test's own window from %v", got[0], before)
	}
}

// A store's own flush delay (the driver's --cache-flush-delay) replaces FlushDelay for its blobs.
func TestStoreFlushDelayReplacesTheDefault(t *testing.T) {
	defer func(d time.Duration) { FlushDelay = d }(FlushDelay)
	FlushDelay = time.Hour
	s := open(t)
	flushed := make(chan int, 1)
	s.ObserveFlushes(func(items int, _ time.Time, _ time.Duration) { flushed <- items })
	s.SetFlushDelay(time.Millisecond)
	ingest(t, s, blob(1<<20))
	select {
	case n := <-flushed:
		if n != 1 {
			t.Errorf("flushed %d blobs, want 1", n)
		}
	case <-time.After(time.Minute):
		t.Fatal("no background flush a minute after the commit, with the store's delay at 1ms (FlushDelay: 1h)")
	}
	s.SetFlushDelay(0)
	if got := s.flushDelay(); got != FlushDelay {
		t.Errorf("after SetFlushDelay(0) the delay is %v, want FlushDelay (%v)", got, FlushDelay)
	}
}
