package prepull

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Watcher keeps one list on the driver equal to a list file, the DaemonSet way: the file is a mounted ConfigMap,
// which the kubelet updates by swapping a symlink, so the file is re-read on a timer rather than watched by inode.
// It needs nothing from the Kubernetes API.
type Watcher struct {
	Client *Client
	File   string
	List   string
	// Poll is how often the file is re-read (default 2s); Resync how often the list is sent again even when the
	// file is unchanged (default 1m), which restores a restarted driver.
	Poll, Resync time.Duration
	Log          *slog.Logger
	Metrics      *WatchMetrics

	// Readiness is what the pod's readiness probe reads (Ready): the fleet's view of "this node holds every
	// listed model" is then kubectl rollout status and kubectl get pods, with no API access from the node.
	rmu     sync.Mutex
	rloaded bool
	rwant   []string
	rseen   map[string]Entry
}

// Ready reports whether the driver holds every reference of the last good list, and otherwise why not: the
// list not loaded yet, or each reference still pending, pulling or failed (with its error). A bad edit keeps the
// last good list, so readiness follows the list in force, not the file.
func (w *Watcher) Ready() (bool, string) {
	w.rmu.Lock()
	defer w.rmu.Unlock()
	if !w.rloaded {
		return false, "prepull list not loaded yet"
	}
	var lag []string
	for _, r := range w.rwant {
		e, ok := w.rseen[r]
		switch {
		case !ok:
			lag = append(lag, r+": not yet known to the driver")
		case e.State != StateReady:
			lag = append(lag, r+": "+e.Status())
		}
	}
	if len(lag) > 0 {
		return false, fmt.Sprintf("%d of %d models not ready: %s", len(lag), len(w.rwant), strings.Join(lag, "; "))
	}
	return true, fmt.Sprintf("all %d models ready", len(w.rwant))
}

func (w *Watcher) setWant(refs []string) {
	w.rmu.Lock()
	defer w.rmu.Unlock()
	w.rloaded, w.rwant = true, append([]string(nil), refs...)
}

func (w *Watcher) setSeen(entries []Entry) {
	seen := make(map[string]Entry, len(entries))
	for _, e := range entries {
		seen[e.Ref] = e
	}
	w.rmu.Lock()
	defer w.rmu.Unlock()
	w.rseen = seen
}

// Run reconciles until ctx ends. A file that does not parse leaves the last good list in force, so a bad edit
// never unpins the models already on the node.
func (w *Watcher) Run(ctx context.Context) error {
	if err := validList(w.List); err != nil {
		return err
	}
	poll, resync := w.Poll, w.Resync
	if poll <= 0 {
		poll = 2 * time.Second
	}
	if resync <= 0 {
		resync = time.Minute
	}
	log := w.Log
	if log == nil {
		log = slog.Default()
	}
	m := w.Metrics
	if m == nil {
		m = NewWatchMetrics(nil, "")
	}

	// Progress is followed on its own so a slow long poll never delays reacting to the file.
	want := make(chan []string, 1)
	again := make(chan struct{}, 1)
	go w.follow(ctx, log, m, want, again)

	var (
		content    []byte
		examined   bool // content has been parsed (well or not)
		unreadable bool
		refs       []string
		loaded     bool
		synced     bool
		lastSync   time.Time
	)
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		b, err := os.ReadFile(w.File)
		switch {
		case err != nil:
			if !unreadable {
				log.Error("prepull list unreadable; keeping the last good list", "file", w.File, "err", err)
			}
			unreadable, content = true, nil
			m.listValid.Set(0)
		case !examined || unreadable || !bytes.Equal(b, content):
			examined, unreadable, content = true, false, b
			parsed, perr := ParseList(b)
			if perr != nil {
				log.Error("prepull list invalid; keeping the last good list", "file", w.File, "err", perr)
				m.listValid.Set(0)
				break
			}
			m.listValid.Set(1)
			refs, loaded, synced = parsed, true, false
			log.Info("prepull list loaded", "file", w.File, "entries", len(refs))
		}
		if loaded && (!synced || time.Since(lastSync) >= resync) {
			_, err := w.Client.SetList(ctx, w.List, refs)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				m.apiUp.Set(0)
				log.Error("prepull API unreachable; will retry", "err", err)
			} else {
				m.apiUp.Set(1)
				m.reconciles.Inc()
				synced, lastSync = true, time.Now()
				m.listEntries.Set(float64(len(refs)))
				w.setWant(refs)
				// Entry metrics come from the follower alone: a reply to this call may be older than what it
				// has already seen, and would set the metrics back with nothing left to correct them.
				select {
				case <-want:
				default:
				}
				want <- refs
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-again:
			synced = false
		}
	}
}

// follow long-polls the driver and turns every change into metrics and log lines.
// A restarted driver has forgotten the entries still pulling; the follower asks Run to send the list again as
// soon as it sees one missing, instead of waiting for the resync period.
func (w *Watcher) follow(ctx context.Context, log *slog.Logger, m *WatchMetrics, want <-chan []string, again chan<- struct{}) {
	var (
		since   uint64
		last    = map[string]string{} // ref -> what was last logged
		desired []string
	)
	for ctx.Err() == nil {
		select {
		case desired = <-want: // a reconcile happened: the server may be new, start from its current version
			since = 0
		default:
		}
		s, err := w.Client.Entries(ctx, w.List, since)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			m.apiUp.Set(0)
			since = 0
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
			continue
		}
		m.apiUp.Set(1)
		// A restarted server counts from zero again; waiting for an old, higher version would stall.
		if s.Version < since {
			since = 0
			continue
		}
		since = s.Version
		m.observe(s.Entries)
		w.setSeen(s.Entries)
		seen := map[string]bool{}
		for _, e := range s.Entries {
			seen[e.Ref] = true
		}
		for _, r := range desired {
			if !seen[r] {
				select {
				case again <- struct{}{}:
				default:
				}
				break
			}
		}
		for _, e := range s.Entries {
			st := e.Status()
			// Progress is logged in steps of 10% so a large pull leaves a readable trail, not a flood.
			logged := st
			if e.State == StatePulling {
				logged = fmt.Sprintf("pulling %d", e.Percent()/10)
			}
			if logged == last[e.Ref] {
				continue
			}
			last[e.Ref] = logged
			attrs := []any{"ref", e.Ref, "state", string(e.State), "percent", e.Percent()}
			if e.Digest != "" {
				attrs = append(attrs, "digest", e.Digest.String())
			}
			if e.State == StateFailed {
				log.Warn("prepull "+st, append(attrs, "reason", e.Error)...)
			} else {
				log.Info("prepull "+st, attrs...)
			}
		}
		for ref := range last {
			if !seen[ref] {
				delete(last, ref)
				log.Info("prepull removed", "ref", ref)
			}
		}
	}
}

// WatchMetrics is what the prepull DaemonSet exports per node.
type WatchMetrics struct {
	state       *prometheus.GaugeVec
	progress    *prometheus.GaugeVec
	bytes       *prometheus.GaugeVec
	failure     *prometheus.GaugeVec
	listEntries prometheus.Gauge
	listValid   prometheus.Gauge
	apiUp       prometheus.Gauge
	reconciles  prometheus.Counter

	mu    sync.Mutex // Run and its follower both report
	known map[string]Entry
}

var states = []State{StatePending, StatePulling, StateReady, StateFailed}

// NewWatchMetrics registers the metrics with reg (none when nil); node, if set, labels every series so a
// federated view still tells nodes apart.
func NewWatchMetrics(reg prometheus.Registerer, node string) *WatchMetrics {
	var cl prometheus.Labels
	if node != "" {
		cl = prometheus.Labels{"node": node}
	}
	g := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "modelpack", Subsystem: "prepull", Name: name, Help: help, ConstLabels: cl}, labels)
	}
	m := &WatchMetrics{
		state:    g("state", "1 for the state each listed reference is in on this node, 0 for the others.", "ref", "state"),
		progress: g("progress_ratio", "Fraction of each listed reference's content in the node cache.", "ref"),
		bytes:    g("total_bytes", "Size of each listed reference's content, once known.", "ref"),
		failure:  g("failure", "1 while a listed reference's last attempt failed, labelled with the reason.", "ref", "reason"),
		listEntries: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "modelpack", Subsystem: "prepull", Name: "list_entries",
			Help: "References in the list file last loaded.", ConstLabels: cl}),
		listValid: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "modelpack", Subsystem: "prepull", Name: "list_valid",
			Help: "1 when the list file was last read and parsed without error.", ConstLabels: cl}),
		apiUp: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "modelpack", Subsystem: "prepull", Name: "api_up",
			Help: "1 when the driver's prepull API answered the last call.", ConstLabels: cl}),
		reconciles: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "modelpack", Subsystem: "prepull", Name: "reconciles_total",
			Help: "Lists sent to the driver.", ConstLabels: cl}),
		known: map[string]Entry{},
	}
	if reg != nil {
		reg.MustRegister(m.state, m.progress, m.bytes, m.failure, m.listEntries, m.listValid, m.apiUp, m.reconciles)
	}
	return m
}

// observe replaces the per-reference series with those of entries.
func (m *WatchMetrics) observe(entries []Entry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	for _, e := range entries {
		seen[e.Ref] = true
		if old, ok := m.known[e.Ref]; ok && old.State == StateFailed && (e.State != StateFailed || old.Error != e.Error) {
			m.failure.DeleteLabelValues(e.Ref, reason(old.Error))
		}
		for _, s := range states {
			v := 0.0
			if s == e.State {
				v = 1
			}
			m.state.WithLabelValues(e.Ref, string(s)).Set(v)
		}
		m.progress.WithLabelValues(e.Ref).Set(float64(e.Percent()) / 100)
		if e.Total > 0 {
			m.bytes.WithLabelValues(e.Ref).Set(float64(e.Total))
		}
		if e.State == StateFailed {
			m.failure.WithLabelValues(e.Ref, reason(e.Error)).Set(1)
		}
		m.known[e.Ref] = e
	}
	for ref, old := range m.known {
		if seen[ref] {
			continue
		}
		for _, s := range states {
			m.state.DeleteLabelValues(ref, string(s))
		}
		m.progress.DeleteLabelValues(ref)
		m.bytes.DeleteLabelValues(ref)
		if old.State == StateFailed {
			m.failure.DeleteLabelValues(ref, reason(old.Error))
		}
		delete(m.known, ref)
	}
}

// reason bounds a label value: registry errors can carry whole response bodies.
func reason(s string) string {
	const max = 200
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}
