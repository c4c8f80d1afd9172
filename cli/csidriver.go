package cli

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	humanize "github.com/dustin/go-humanize"

	"github.com/spf13/cobra"

	"github.com/modelpack/modelpack/artifact/archive"
	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/cache"
	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/csidriver"
	"github.com/modelpack/modelpack/csidriver/access"
	"github.com/modelpack/modelpack/internal/node"
	"github.com/modelpack/modelpack/internal/readahead"
	"github.com/modelpack/modelpack/prepull"
)

type csiDriverFlags struct {
	endpoint, nodeID, root, driverName, metricsAddr string
	hostsDir, registryConfig, caFile                string
	plainHTTP                                       []string
	cacheMax, maxExtract                            string
	cacheHigh, cacheLow                             int
	maxExtractRatio                                 float64
	registryTimeouts                                remote.Timeouts
	gcInterval                                      time.Duration
	verifyInterval, cacheMinAge, flushDelay         time.Duration
	scrubRate                                       string
	readahead                                       string
	readaheadWait                                   time.Duration
	logFormat, logLevel                             string
	verificationPolicy                              string
	verificationAllowlist                           []string
	policy                                          string
	prepull                                         bool
	prepullSocket, prepullBandwidth                 string
	prepullConcurrency                              int
}

func csiDriverCmd(g *Globals) *cobra.Command {
	f := &csiDriverFlags{}
	cmd := &cobra.Command{
		Use: "csi-driver",
		Example: `  modelpack csi-driver --endpoint unix:///csi/csi.sock --node-id "$NODE_NAME" --root /var/lib/modelpack \
    --policy /etc/modelpack/policy/policy.yaml --cache-max-size 100GiB`,
		Short: "Run the CSI node plugin that mounts models read-only into pods",
		Long: `Run the CSI node plugin. Pods name a model in a volume's attributes and the node mounts it read-only,
with the semantics of Kubernetes image volumes:

  volumeAttributes:
    reference: registry.example.com/models/llama:v1   # required: a tag or a digest
    pullPolicy: IfNotPresent                          # Always | IfNotPresent | Never
    filter: weight,weight.config                      # weight, weight.config, doc, code, dataset
    include: "*.safetensors,tokenizer*"               # path globs
    subPath: tokenizer                                # a directory inside the model
    platform: linux/amd64                             # for multi-platform artifacts
    noexec: "true"

Pulls outlive kubelet's deadline: a publish that runs out of time returns ABORTED with the progress and the
retry joins the pull under way. State under --root survives restarts, SIGKILL included.

A registry that stalls cannot hold a pull: --registry-response-timeout bounds the wait for an upload's headers,
--registry-idle-timeout a download without a byte (and the answer to a manifest read), and --registry-attempts
the attempts in a row without progress before the pull fails with UNAVAILABLE; a volume of the same digest from
another registry is served from whichever registry delivers, never held by a stalled one. A tar layer may expand to --max-extract-ratio times its declared size and --max-extract-bytes in
all (sparse files at their apparent size), checked before a byte is written; over either, FAILED_PRECONDITION.

The node cache is shared, models are not: a model on the node is mounted for a caller only when its registry
served that digest, under the host and repository the caller names, to the caller's credentials (its pull
secret's, or the node's, or none for public content); any other caller is first checked with the registry,
with a manifest request and its own credentials, and refused with the registry's answer. Prepulled models are
exempt unless --image-pull-credentials-verification-policy says otherwise (kubelet's names and default).

Errors: INVALID_ARGUMENT bad attributes; ABORTED pull continues, retry joins it; FAILED_PRECONDITION
pullPolicy Never and absent, content over the limits, hostile or corrupt content (republish it); NOT_FOUND;
UNAVAILABLE registry unreachable, stalled or untrusted TLS (--ca-file, --hosts-dir, --plain-http-registries);
UNAUTHENTICATED; PERMISSION_DENIED registry or signature policy; RESOURCE_EXHAUSTED disk full; INTERNAL a bug.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runCSIDriver(cmd.Context(), f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.endpoint, "endpoint", envOr("CSI_ENDPOINT", csidriver.DefaultEndpoint), "CSI endpoint, unix:///path/to/csi.sock (env CSI_ENDPOINT)")
	fl.StringVar(&f.nodeID, "node-id", os.Getenv("NODE_NAME"), "node id reported to Kubernetes, normally the node name (env NODE_NAME)")
	fl.StringVar(&f.root, "root", "/var/lib/modelpack", "node directory for the cache and the driver's state")
	fl.StringVar(&f.driverName, "driver-name", csidriver.DefaultDriverName, "CSI driver name")
	fl.StringVar(&f.metricsAddr, "metrics-addr", csidriver.DefaultMetricsAddr("9808"), "address serving /metrics and /healthz (empty disables; default: $POD_IP, else 127.0.0.1)")
	fl.StringVar(&f.hostsDir, "hosts-dir", "", "containerd-style hosts directory with per-registry mirrors and TLS (hosts.toml)")
	fl.StringVar(&f.registryConfig, "registry-config", "", "docker config.json with the node's registry credentials and helpers (default: docker's)")
	fl.StringVar(&f.caFile, "ca-file", "", "PEM CA bundle trusted for registries in addition to the system roots")
	fl.StringSliceVar(&f.plainHTTP, "plain-http-registries", nil, "registries (host[:port]) reached over plain HTTP")
	fl.StringVar(&f.cacheMax, "cache-max-size", "0", "evict least recently used models above this size (e.g. 200GiB; 0 = no limit)")
	fl.IntVar(&f.cacheHigh, "cache-high-watermark", 0, "percent of the cache's file system used (statfs, every file on it, as df shows) at which a collection evicts unused models down to --cache-low-watermark; "+
		"1 to 100, 0 = off (kubelet's --image-gc-high-threshold). With --cache-max-size both apply: whichever asks for the smaller cache wins")
	fl.IntVar(&f.cacheLow, "cache-low-watermark", 0, "percent of the cache's file system a collection started by --cache-high-watermark evicts down to; 0 to below --cache-high-watermark (kubelet's --image-gc-low-threshold)")
	fl.DurationVar(&f.cacheMinAge, "cache-min-age", cache.DefaultMinAge, "never evict content used this recently (the cache may exceed --cache-max-size by it meanwhile; 0 = no protection)")
	fl.StringVar(&f.maxExtract, "max-extract-bytes", "1TiB", "largest a tar layer may expand to (decompression and sparse-file bombs)")
	fl.Float64Var(&f.maxExtractRatio, "max-extract-ratio", archive.DefaultLimits.MaxRatio, "largest a tar layer may expand to, as a multiple of its declared size (never below 64MiB)")
	fl.DurationVar(&f.registryTimeouts.ResponseHeader, "registry-response-timeout", remote.DefaultTimeouts.ResponseHeader, "how long a registry request waits for the response headers (manifest reads get --registry-idle-timeout)")
	fl.DurationVar(&f.registryTimeouts.Idle, "registry-idle-timeout", remote.DefaultTimeouts.Idle, "how long a blob download may go without a byte before it reconnects")
	fl.IntVar(&f.registryTimeouts.Attempts, "registry-attempts", remote.DefaultTimeouts.Attempts, "attempts in a row without a byte of progress before a download fails")
	fl.DurationVar(&f.gcInterval, "gc-interval", 5*time.Minute, "how often orphaned volumes and the cache are collected")
	fl.DurationVar(&f.verifyInterval, "cache-verify-interval", 24*time.Hour, "how often the background scrub re-hashes every cached blob (damaged ones are quarantined and pulled again; 0 = only after an unclean start)")
	fl.DurationVar(&f.flushDelay, "cache-flush-delay", cas.FlushDelay, "how long after a pull's last blob its bytes are flushed to disk in the background (until then a restart of the machine costs their re-hash, never wrong bytes)")
	fl.StringVar(&f.scrubRate, "cache-scrub-rate", "128MiB", "most bytes per second the background scrub reads (at idle I/O priority; 0 = no cap)")
	fl.StringVar(&f.readahead, "readahead", "auto", "read a published volume's files into the page cache at once, in the background, up to a budget per volume: "+
		"auto (half the node's available memory, and of the driver's cgroup memory limit), off, or a size (e.g. 8GiB)")
	fl.DurationVar(&f.readaheadWait, "readahead-wait", csidriver.DefaultReadaheadWait, "how long the readahead of a volume waits before it reads; a pod that opens one of the volume's files meanwhile reads it itself, "+
		"and the readahead is dropped (0: read ahead at the mount)")
	fl.StringVar(&f.verificationPolicy, "image-pull-credentials-verification-policy", string(access.DefaultMode),
		"when a model on the node is mounted for a caller without asking its registry (kubelet's setting of the same name): "+
			"NeverVerify, NeverVerifyPreloadedImages (prepulled models exempt), NeverVerifyAllowlistedImages (prepulled models under "+
			"--preloaded-images-verification-allowlist exempt) or AlwaysVerify. Any other caller is checked with the registry first, with its own credentials")
	fl.StringSliceVar(&f.verificationAllowlist, "preloaded-images-verification-allowlist", nil,
		"with NeverVerifyAllowlistedImages: registry/repository names, or prefixes ending in /* (registry.example.com/models/*), whose prepulled models any caller may mount")
	fl.StringVar(&f.logFormat, "log-format", "json", "log format: json or text")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fl.StringVar(&f.policy, "policy", "", "node trust policy (YAML); reloaded on change. Empty: signatures are not checked. Signatures are read like models: --ca-file, --hosts-dir (mirrors too), --plain-http-registries, never https→http")
	fl.BoolVar(&f.prepull, "prepull", true, "serve the prepull API (node plugins; the controller needs none)")
	fl.StringVar(&f.prepullSocket, "prepull-socket", "", "unix socket of the prepull API (default: prepull.sock next to the CSI socket, "+prepull.DefaultSocket+" in the DaemonSet)")
	fl.IntVar(&f.prepullConcurrency, "prepull-concurrency", 2, "references prepulled at once; the rest wait as pending")
	fl.StringVar(&f.prepullBandwidth, "prepull-bandwidth", "0", "cap on the registry reads of all prepulls together, bytes per second (e.g. 100MiB; 0 = no cap)")
	return cmd
}

// runCSIDriver checks the flags and runs the node plugin they describe (package internal/node builds it).
func runCSIDriver(parent context.Context, f *csiDriverFlags) error {
	log, err := newLogger(f.logFormat, f.logLevel)
	if err != nil {
		return err
	}
	if f.nodeID == "" {
		if f.nodeID, err = os.Hostname(); err != nil {
			return fmt.Errorf("--node-id not given and no hostname: %w", err)
		}
	}
	maxBytes, err := parseByteSize(f.cacheMax)
	if err != nil {
		return usageErr("--cache-max-size: %w", err)
	}
	if err := cache.CheckWatermarks(f.cacheHigh, f.cacheLow, "--cache-high-watermark", "--cache-low-watermark"); err != nil {
		return usageErr("%w", err)
	}
	if f.flushDelay <= 0 {
		return usageErr("--cache-flush-delay %s: want a duration above 0 (e.g. %s)", f.flushDelay, cas.FlushDelay)
	}
	maxExtract, err := parseByteSize(f.maxExtract)
	if err != nil || maxExtract <= 0 {
		return usageErr("--max-extract-bytes %q: want a size above 0 (e.g. 500GiB)", f.maxExtract)
	}
	if f.maxExtractRatio < 1 {
		return usageErr("--max-extract-ratio %g: want 1 or more", f.maxExtractRatio)
	}
	scrubRate, err := parseByteSize(f.scrubRate)
	if err != nil || scrubRate < 0 {
		return usageErr("--cache-scrub-rate %q: want a size per second (e.g. 128MiB; 0 = no cap)", f.scrubRate)
	}
	if scrubRate == 0 {
		scrubRate = -1 // cache.Options: negative is no cap
	}
	ahead, err := parseReadahead(f.readahead)
	if err != nil {
		return err
	}
	accessPolicy, err := access.NewPolicy(f.verificationPolicy, f.verificationAllowlist)
	if err != nil {
		return err // it names the setting and its valid values
	}
	if f.prepullConcurrency < 1 {
		return usageErr("--prepull-concurrency must be at least 1")
	}
	prepullBPS, err := parseByteSize(f.prepullBandwidth)
	if err != nil {
		return usageErr("--prepull-bandwidth: %w", err)
	}
	if parent == nil {
		parent = context.Background()
	}
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return node.Run(ctx, node.Options{
		Root: f.root,
		Cache: cache.Options{MaxBytes: maxBytes, HighWatermark: f.cacheHigh, LowWatermark: f.cacheLow,
			Limits:         archive.Limits{MaxBytes: maxExtract, MaxRatio: f.maxExtractRatio},
			VerifyInterval: f.verifyInterval, ScrubRate: scrubRate, MinAge: minAge(f.cacheMinAge), FlushDelay: f.flushDelay,
			VolatileOwnerPrefix: csidriver.OwnerPrefix},
		Remote: remote.Options{
			RegistryConfig: f.registryConfig,
			HostsDir:       f.hostsDir,
			CAFile:         f.caFile,
			UserAgent:      "modelpack-csi/" + Version,
			Timeouts:       f.registryTimeouts,
			PlainHTTPHosts: f.plainHTTP,
		},
		Driver: csidriver.Options{
			DriverName:    f.driverName,
			Version:       Version,
			NodeID:        f.nodeID,
			Endpoint:      f.endpoint,
			MetricsAddr:   f.metricsAddr,
			Logger:        log,
			GCInterval:    f.gcInterval,
			AccessPolicy:  accessPolicy,
			Readahead:     ahead,
			ReadaheadWait: f.readaheadWait,
		},
		PolicyPath: f.policy,
		Prepull:    node.Prepull{Enabled: f.prepull, Socket: f.prepullSocket, Concurrency: f.prepullConcurrency, Bandwidth: prepullBPS},
		Collect:    maxBytes > 0 || f.cacheHigh > 0,
	})
}

func newLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usageErr("--log-level %q: valid: debug, info, warn, error", level)
	}
	o := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, o)), nil
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, o)), nil
	}
	return nil, usageErr("--log-format %q: valid: json, text", format)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// parseByteSize reads a byte count with an optional binary or decimal unit (512MiB, 200G, 1.5TiB).
func parseByteSize(s string) (int64, error) {
	n, err := humanize.ParseBytes(strings.TrimSpace(s))
	if err != nil || n > math.MaxInt64 {
		return 0, fmt.Errorf("invalid size %q (e.g. 512MiB, 200GiB)", s)
	}
	return int64(n), nil
}

// parseReadahead reads --readahead: auto, off (or 0), or a byte budget; nil is off.
func parseReadahead(s string) (readahead.Budget, error) {
	switch strings.TrimSpace(s) {
	case "auto":
		return readahead.Auto, nil
	case "off":
		return nil, nil
	}
	n, err := parseByteSize(s)
	if err != nil {
		return nil, usageErr("--readahead %q: want auto, off or a size (e.g. 8GiB)", s)
	}
	if n == 0 {
		return nil, nil
	}
	return readahead.Fixed(n), nil
}

// minAge maps the flag's 0 (no protection) to cache.Options' negative.
func minAge(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
