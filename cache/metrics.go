package cache

import "github.com/prometheus/client_golang/prometheus"

// metrics are per Cache (so tests can open several); Collector exposes them for the caller to register.
type metrics struct {
	pulls          *prometheus.CounterVec
	scans          *prometheus.CounterVec
	lies           *prometheus.CounterVec
	fetchedBytes   prometheus.Counter
	extractions    prometheus.Counter
	extractSeconds prometheus.Histogram
	viewBuilds     prometheus.Counter
	viewFiles      prometheus.Counter
	viewSeconds    prometheus.Histogram
	acquires       prometheus.Counter
	acquireSeconds prometheus.Histogram
	gcRuns         prometheus.Counter
	gcEvictions    prometheus.Counter
	gcFreed        prometheus.Counter
	verifyProblems prometheus.Counter
	corruptBlobs   *prometheus.CounterVec

	scrubBytes          prometheus.Counter
	scrubCorrupt        prometheus.Counter
	scrubLastCompletion prometheus.Gauge
	scrubPassBytes      prometheus.Gauge
	scrubPassDone       prometheus.Gauge

	flushing prometheus.GaugeFunc // set by Open: it reads the cache's flushers
	disk     prometheus.GaugeFunc // set by Open: statfs of the root, what the watermarks compare
}

func newMetrics() *metrics {
	const ns, sub = "modelpack", "cache"
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	hist := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help,
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)})
	}
	return &metrics{
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "pulls_total",
			Help: "Pull calls by result: pulled, joined (an in-flight pull), cached, unproven (a blob the caller's source does not serve), error."}, []string{"result"}),
		lies: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "lying_sources_total",
			Help: "Blob reads whose bytes did not match their digest, by the source or endpoint (mirror, peer) that sent them; each costs a read from the next."}, []string{"source"}),
		scans: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "blob_scans_total",
			Help: "Blob scans by verdict (data, code, malformed), and cached (a report already kept)."}, []string{"result"}),
		fetchedBytes:   counter("fetched_bytes_total", "Bytes of layers received from registries."),
		extractions:    counter("layer_extractions_total", "Tar layers extracted."),
		extractSeconds: hist("layer_extraction_seconds", "Time to extract a tar layer."),
		viewBuilds:     counter("view_builds_total", "Views assembled."),
		viewFiles:      counter("view_files_total", "Files hardlinked into views."),
		viewSeconds:    hist("view_build_seconds", "Time to assemble a view."),
		acquires:       counter("acquires_total", "References taken on views."),
		acquireSeconds: hist("acquire_seconds", "Time of Acquire, including a view build when needed."),
		gcRuns:         counter("gc_runs_total", "Garbage collections."),
		gcEvictions:    counter("gc_evictions_total", "Manifests evicted by garbage collection."),
		gcFreed:        counter("gc_freed_bytes_total", "Bytes freed by garbage collection."),
		verifyProblems: counter("verify_problems_total", "Problems found by Verify."),
		corruptBlobs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "corrupt_blobs_total",
			Help: "Damaged blobs taken out of use (quarantined, pulled again), by problem: missing, size, digest; extracted: a changed file of an extracted layer (extracted again)."}, []string{"problem"}),
		scrubBytes:   counter("scrub_bytes_total", "Bytes re-hashed by the background scrub."),
		scrubCorrupt: counter("scrub_corrupt_blobs_total", "Damaged blobs the background scrub found (also counted in corrupt_blobs_total)."),
		scrubLastCompletion: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "scrub_last_completion_timestamp_seconds",
			Help: "When the last background scrub of every blob completed (Unix time)."}),
		scrubPassBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "scrub_pass_bytes",
			Help: "Bytes the scrub under way has to re-hash in all (0 when none runs)."}),
		scrubPassDone: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "scrub_pass_done_bytes",
			Help: "Bytes the scrub under way (or the last one) has re-hashed so far."}),
	}
}

// flushingGauge reports 1 while a background flush makes committed blobs or extracted layers durable: the window in
// which every fsync on the disk competes with it (warm publishes included).
func (c *Cache) flushingGauge() prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "modelpack", Subsystem: "cache", Name: "flushing",
		Help: "1 while a background flush makes committed blobs or extracted layers durable, else 0."},
		func() float64 {
			if c.blobs.Flushing() || c.layerFlusher.Busy() {
				return 1
			}
			return 0
		})
}

// diskGauge reports how full the cache's file system is, in percent as the watermarks and df count it (statfs at
// each scrape): what an operator sets --cache-high-watermark against.
func (c *Cache) diskGauge() prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "modelpack", Subsystem: "cache", Name: "disk_used_percent",
		Help: "Percent of the cache's file system in use (statfs, every file on it counted), as the disk watermarks compare it."},
		func() float64 {
			fs, err := statFS(c.root)
			if err != nil {
				return -1
			}
			return float64(fs.percent())
		})
}

// Collector returns the cache's Prometheus metrics, to register with a registry.
func (c *Cache) Collector() prometheus.Collector { return collector{c.m} }

type collector struct{ m *metrics }

func (c collector) all() []prometheus.Collector {
	m := c.m
	return []prometheus.Collector{m.pulls, m.scans, m.lies, m.fetchedBytes, m.extractions, m.extractSeconds, m.viewBuilds, m.viewFiles,
		m.viewSeconds, m.acquires, m.acquireSeconds, m.gcRuns, m.gcEvictions, m.gcFreed, m.verifyProblems, m.corruptBlobs,
		m.scrubBytes, m.scrubCorrupt, m.scrubLastCompletion, m.scrubPassBytes, m.scrubPassDone, m.flushing, m.disk}
}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, x := range c.all() {
		x.Describe(ch)
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, x := range c.all() {
		x.Collect(ch)
	}
}
