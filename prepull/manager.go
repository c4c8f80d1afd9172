package prepull

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
)

// Options tune the prepull server.
type Options struct {
	// Concurrency is how many references pull at once (default 2); the rest wait as pending.
	Concurrency int
	// RetryDelay is the first wait after a failure (default 30s); it doubles up to MaxRetryDelay (default 10m).
	RetryDelay, MaxRetryDelay time.Duration
	// Logger receives state changes (default slog.Default()).
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Concurrency <= 0 {
		o.Concurrency = 2
	}
	if o.RetryDelay <= 0 {
		o.RetryDelay = 30 * time.Second
	}
	if o.MaxRetryDelay < o.RetryDelay {
		o.MaxRetryDelay = max(10*time.Minute, o.RetryDelay)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

type key struct{ list, ref string }

type item struct {
	e Entry // guarded by manager.mu

	cancel  context.CancelFunc
	running bool // its goroutine has not returned yet
	removed bool
	// released is closed once a removed item's pin is gone, so a re-added entry never races the old unpin.
	released chan struct{}
	retry    chan struct{} // a nudge to retry a failed entry now
	prev     *item         // the removed item this one replaces, if its release is still under way
}

// manager owns the entries; the HTTP layer only translates.
type manager struct {
	be   Backend
	opts Options
	log  *slog.Logger
	sem  chan struct{}
	ctx  context.Context // lifetime of every pull
	wg   sync.WaitGroup

	mu      sync.Mutex
	items   map[key]*item
	leaving map[key]*item // removed, pin not yet released
	version uint64
	changed chan struct{} // closed and replaced on every change
}

func newManager(ctx context.Context, be Backend, opts Options) *manager {
	opts = opts.withDefaults()
	return &manager{
		be:      be,
		opts:    opts,
		log:     opts.Logger,
		sem:     make(chan struct{}, opts.Concurrency),
		ctx:     ctx,
		items:   map[key]*item{},
		leaving: map[key]*item{},
		changed: make(chan struct{}),
	}
}

// restore adopts the pins an earlier run of the server left, so a driver restart neither drops warm models nor
// forgets entries it can later unpin.
func (m *manager) restore(ctx context.Context) error {
	pins, err := m.be.Pins(ctx)
	if err != nil {
		return fmt.Errorf("prepull: reading pins: %w", err)
	}
	sizes := m.cachedSizes(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, d := range pins {
		list, ref, ok := parsePin(name)
		if !ok {
			continue
		}
		k := key{list, ref}
		if _, dup := m.items[k]; dup {
			continue
		}
		m.items[k] = &item{
			e:        Entry{List: list, Ref: ref, Digest: d, State: StateReady, Pin: name, Done: sizes[d], Total: sizes[d], Updated: time.Now()},
			released: make(chan struct{}),
			retry:    make(chan struct{}, 1),
		}
		m.log.Info("prepull restored", "list", list, "ref", ref, "digest", d)
	}
	m.bumpLocked()
	return nil
}

func (m *manager) bumpLocked() {
	m.version++
	close(m.changed)
	m.changed = make(chan struct{})
}

// add starts every ref not yet on list and nudges the failed ones to retry now.
func (m *manager) add(list string, refs []string) error {
	if err := validList(list); err != nil {
		return err
	}
	for _, r := range refs {
		if err := validRef(r); err != nil {
			return err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range refs {
		k := key{list, r}
		if it, ok := m.items[k]; ok {
			if it.e.State == StateFailed {
				select {
				case it.retry <- struct{}{}:
				default:
				}
			}
			continue
		}
		m.startLocked(k)
	}
	m.bumpLocked()
	return nil
}

func (m *manager) startLocked(k key) {
	ctx, cancel := context.WithCancel(m.ctx)
	it := &item{
		e:        Entry{List: k.list, Ref: k.ref, State: StatePending, Pin: PinName(k.list, k.ref), Updated: time.Now()},
		cancel:   cancel,
		running:  true,
		released: make(chan struct{}),
		retry:    make(chan struct{}, 1),
		prev:     m.leaving[k],
	}
	m.items[k] = it
	m.wg.Add(1)
	go m.run(ctx, it)
}

// setList makes list hold exactly refs and returns once the removed entries are unpinned (or ctx ends).
func (m *manager) setList(ctx context.Context, list string, refs []string) error {
	if err := m.add(list, refs); err != nil {
		return err
	}
	want := map[string]bool{}
	for _, r := range refs {
		want[r] = true
	}
	var gone []*item
	m.mu.Lock()
	for k, it := range m.items {
		if k.list == list && !want[k.ref] {
			gone = append(gone, m.removeLocked(k, it))
		}
	}
	m.bumpLocked()
	m.mu.Unlock()
	return m.awaitReleased(ctx, gone)
}

var errNotFound = errors.New("no such entry")

// remove cancels one entry and returns once its pin is gone (or ctx ends).
func (m *manager) remove(ctx context.Context, list, ref string) error {
	m.mu.Lock()
	it, ok := m.items[key{list, ref}]
	if !ok {
		m.mu.Unlock()
		return fmt.Errorf("%w: %s on list %s", errNotFound, ref, list)
	}
	m.removeLocked(key{list, ref}, it)
	m.bumpLocked()
	m.mu.Unlock()
	return m.awaitReleased(ctx, []*item{it})
}

// removeLocked takes the entry off its list. A running item releases its own pin when its goroutine returns;
// an idle one is released here, so exactly one party unpins.
func (m *manager) removeLocked(k key, it *item) *item {
	delete(m.items, k)
	m.leaving[k] = it
	it.removed = true
	if it.cancel != nil {
		it.cancel()
	}
	if !it.running {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.release(it)
		}()
	}
	m.log.Info("prepull removed", "list", k.list, "ref", k.ref)
	return it
}

func (m *manager) release(it *item) {
	if it.prev != nil {
		<-it.prev.released // an older generation's unpin must not land after ours
	}
	// The server may be shutting down; an unpin still has to happen, so it gets its own bounded context.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.ctx), time.Minute)
	defer cancel()
	if err := m.be.Unpin(ctx, it.e.Pin); err != nil {
		m.log.Error("prepull unpin failed", "pin", it.e.Pin, "err", err)
	}
	k := key{it.e.List, it.e.Ref}
	m.mu.Lock()
	if m.leaving[k] == it {
		delete(m.leaving, k)
	}
	m.mu.Unlock()
	close(it.released)
}

func (m *manager) awaitReleased(ctx context.Context, items []*item) error {
	for _, it := range items {
		select {
		case <-it.released:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// run pulls one entry until it is ready, retrying failures with backoff until the entry is removed.
func (m *manager) run(ctx context.Context, it *item) {
	defer m.wg.Done()
	defer func() {
		m.mu.Lock()
		it.running = false
		removed := it.removed
		m.mu.Unlock()
		if removed {
			m.release(it)
		}
	}()
	if it.prev != nil {
		select {
		case <-it.prev.released:
		case <-ctx.Done():
			return
		}
	}
	delay := m.opts.RetryDelay
	for {
		err := m.attempt(ctx, it)
		if err == nil || ctx.Err() != nil {
			return
		}
		m.update(it, func(e *Entry) { e.State, e.Error = StateFailed, err.Error() })
		m.log.Warn("prepull failed", "list", it.e.List, "ref", it.e.Ref, "err", err, "retry_in", delay)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-it.retry:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return
		}
		delay = min(delay*2, m.opts.MaxRetryDelay)
	}
}

func (m *manager) attempt(ctx context.Context, it *item) error {
	select {
	case m.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-m.sem }()
	ref, pin := it.e.Ref, it.e.Pin // immutable after start
	m.update(it, func(e *Entry) {
		e.State, e.Error, e.Done, e.Total = StatePulling, "", 0, 0
		e.Attempts++
	})
	m.log.Info("prepull pulling", "list", it.e.List, "ref", ref)
	start := time.Now()
	desc, err := m.be.Resolve(ctx, ref)
	if err != nil {
		return fmt.Errorf("resolve: %w", err)
	}
	m.update(it, func(e *Entry) { e.Digest = desc.Digest })
	if err := m.be.Verify(ctx, ref, desc); err != nil {
		return fmt.Errorf("trust policy: %w", err)
	}
	// Between the end of a pull and the pin, cache GC may evict the model: nothing holds it yet. Pulling again
	// fetches whatever went, and a second failure is a real one.
	var manifest digest.Digest
	for try := 1; ; try++ {
		if manifest, err = m.be.Pull(ctx, ref, desc, func(done, total int64) { m.progress(it, done, total) }); err != nil {
			return fmt.Errorf("pull: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err = m.be.Pin(ctx, pin, manifest); err == nil {
			break
		}
		if try == 2 || ctx.Err() != nil {
			return fmt.Errorf("pin: %w", err)
		}
	}
	// A model the cache held already is not transferred, so no progress told its size: the cache's record does.
	m.mu.Lock()
	unknown := it.e.Total == 0
	m.mu.Unlock()
	var held int64
	if unknown {
		held = m.cachedSizes(ctx)[manifest]
	}
	var size int64
	m.update(it, func(e *Entry) {
		e.State = StateReady
		if e.Total == 0 {
			e.Total = held
		}
		e.Done = max(e.Done, e.Total)
		size = e.Total
	})
	m.log.Info("prepull ready", "list", it.e.List, "ref", ref, "digest", desc.Digest, "manifest", manifest, "bytes", size,
		"seconds", time.Since(start).Round(time.Millisecond).Seconds())
	return nil
}

// cachedSizes is the size of each manifest the cache holds (its blobs' bytes); what cannot be read is left
// unknown, the size being only for show.
func (m *manager) cachedSizes(ctx context.Context) map[digest.Digest]int64 {
	entries, err := m.be.Cache(ctx)
	if err != nil {
		m.log.Warn("prepull: listing the cache for sizes", "error", err)
		return nil
	}
	sizes := make(map[digest.Digest]int64, len(entries))
	for _, e := range entries {
		sizes[e.Digest] = e.Size
	}
	return sizes
}

func (m *manager) update(it *item, f func(*Entry)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(&it.e)
	it.e.Updated = time.Now()
	m.bumpLocked()
}

func (m *manager) progress(it *item, done, total int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if it.e.State != StatePulling {
		return
	}
	before := it.e.Percent()
	it.e.Done, it.e.Total = done, total
	// The cache reports every 64 KiB; waking every follower that often would turn long polls into a busy loop.
	// Whole percents and a twice-a-second heartbeat are all anyone reads.
	if it.e.Percent() != before || time.Since(it.e.Updated) >= 500*time.Millisecond {
		it.e.Updated = time.Now()
		m.bumpLocked()
	}
}

// snapshot returns the entries of list (all lists when empty), sorted.
func (m *manager) snapshot(list string) Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.snapshotLocked(list)
}

func (m *manager) snapshotLocked(list string) Snapshot {
	s := Snapshot{Version: m.version, Entries: []Entry{}}
	for k, it := range m.items {
		if list == "" || k.list == list {
			s.Entries = append(s.Entries, it.e)
		}
	}
	slices.SortFunc(s.Entries, func(a, b Entry) int {
		if c := strings.Compare(a.List, b.List); c != 0 {
			return c
		}
		return strings.Compare(a.Ref, b.Ref)
	})
	return s
}

// wait returns the first snapshot newer than since, or the current one when ctx ends first.
func (m *manager) wait(ctx context.Context, list string, since uint64) Snapshot {
	for {
		m.mu.Lock()
		if m.version > since {
			s := m.snapshotLocked(list)
			m.mu.Unlock()
			return s
		}
		ch := m.changed
		m.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return m.snapshot(list)
		}
	}
}

// close waits for every pull to stop; pins stay, so warm models survive a driver restart.
func (m *manager) close() { m.wg.Wait() }
