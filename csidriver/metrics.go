package csidriver

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the driver's Prometheus series, on a registry of their own so several drivers (tests) can live in
// one process.
type metrics struct {
	reg           *prometheus.Registry
	pulls         *prometheus.CounterVec
	pullBytes     prometheus.Counter
	pullDuration  prometheus.Histogram
	pullErrors    *prometheus.CounterVec
	pullsInFlight prometheus.Gauge
	rpcs          *prometheus.CounterVec
	rpcDuration   *prometheus.HistogramVec
	probes        *prometheus.CounterVec
	ready         prometheus.Gauge
	volumes       prometheus.Gauge
	collected     *prometheus.CounterVec
	// readaheadBytes and readaheadSkipped are the bytes of published volumes read into the page cache (those
	// found there already are not counted), and those left out as over the readahead's budget.
	readaheadBytes, readaheadSkipped prometheus.Counter
}

func newMetrics(backend Backend, countVolumes func() int, extra []prometheus.Collector) *metrics {
	const ns = "modelpack_csi"
	m := &metrics{
		reg: prometheus.NewRegistry(),
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "pulls_total",
			Help: "Pulls run by the driver, by result (ok or a gRPC code name).",
		}, []string{"result"}),
		pullBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "pull_bytes_total",
			Help: "Bytes fetched from registries by the driver's pulls.",
		}),
		pullDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Name: "pull_duration_seconds",
			Help:    "Duration of the driver's pulls, from start to completion or failure.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2.5, 12),
		}),
		pullErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "pull_errors_total",
			Help: "Failed pulls by the gRPC code they map to.",
		}, []string{"code"}),
		pullsInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "pulls_in_flight",
			Help: "Pulls running in the background.",
		}),
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "rpcs_total",
			Help: "CSI calls by method and gRPC code.",
		}, []string{"method", "code"}),
		rpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "rpc_duration_seconds",
			Help:    "Duration of CSI calls by method.",
			Buckets: prometheus.ExponentialBuckets(0.001, 3, 12),
		}, []string{"method"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "probes_total",
			Help: "Probe calls by answer (ready or not_ready).",
		}, []string{"answer"}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "ready",
			Help: "1 when the last probe found the cache open.",
		}),
		volumes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "volumes",
			Help: "Targets currently published by this driver.",
		}),
		collected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "volumes_collected_total",
			Help: "Volumes cleaned up by the driver itself, by reason (pod_gone, half_published, unpublish_interrupted, orphaned_view).",
		}, []string{"reason"}),
		readaheadBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "readahead_bytes_total",
			Help: "Bytes of published volumes' files not in the page cache that the driver asked the kernel to read ahead.",
		}),
		readaheadSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "readahead_skipped_bytes_total",
			Help: "Bytes of published volumes' files not read ahead, being over the readahead budget (--readahead).",
		}),
	}
	m.reg.MustRegister(m.pulls, m.pullBytes, m.pullDuration, m.pullErrors, m.pullsInFlight, m.rpcs, m.rpcDuration,
		m.probes, m.ready, m.volumes, m.collected, m.readaheadBytes, m.readaheadSkipped,
		statsCollector{backend},
		prometheus.NewGoCollector(),
		prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}),
	)
	m.reg.MustRegister(extra...)
	m.volumes.Set(float64(countVolumes()))
	return m
}

var (
	cacheBytesDesc = prometheus.NewDesc("modelpack_csi_cache_bytes", "Bytes held by the node cache.", nil, nil)
	viewsDesc      = prometheus.NewDesc("modelpack_csi_views", "Views built in the node cache; every volume of one model and selector shares one.", nil, nil)
	refsDesc       = prometheus.NewDesc("modelpack_csi_view_refs", "Holds on views by volumes and pins.", nil, nil)
)

// statsCollector reads the backend's figures once per scrape: they may cost a walk of the cache.
type statsCollector struct{ b Backend }

func (c statsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- cacheBytesDesc
	ch <- viewsDesc
	ch <- refsDesc
}

func (c statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.b.Stats()
	ch <- prometheus.MustNewConstMetric(cacheBytesDesc, prometheus.GaugeValue, float64(st.CacheBytes))
	ch <- prometheus.MustNewConstMetric(viewsDesc, prometheus.GaugeValue, float64(st.Views))
	ch <- prometheus.MustNewConstMetric(refsDesc, prometheus.GaugeValue, float64(st.Refs))
}
