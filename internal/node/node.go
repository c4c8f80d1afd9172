// Package node is the node plugin's composition root. From its Options it builds, in this order and once each,
// the node cache, the trust policy (signatures and scans), the one registry backend every pull of the node goes
// through, the CSI driver, the prepull API and the cache's collector, hands each to what needs it, and runs them
// until ctx ends. Nothing is wired by side effect: a part that needs another is built after it, below, so the
// order that matters (the policy before anything that pulls, prepull included) is the order of the code.
// `modelpack csi-driver` (package cli) only parses its flags into Options.
package node

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/cache"
	"github.com/modelpack/modelpack/csidriver"
	"github.com/modelpack/modelpack/csidriver/cachebackend"
	"github.com/modelpack/modelpack/prepull"
	"github.com/modelpack/modelpack/scan"
	"github.com/modelpack/modelpack/signing"
)

// Options configure a node plugin.
type Options struct {
	// Root is the node's directory: the cache under cache/, the driver's state under csi/.
	Root string
	// Cache configures the node cache; Run sets its Root and Logger.
	Cache cache.Options
	// Remote is how every registry read of the node (models, signatures, prepulls) is made.
	Remote remote.Options
	// Driver configures the CSI driver; Run sets StateDir, OwnDirs and Backend and adds its collectors. Its Logger
	// is the node's.
	Driver csidriver.Options
	// PolicyPath is the node trust policy (YAML), reloaded when it changes. Empty: no signature is checked and no
	// file scanned.
	PolicyPath string
	// Prepull serves the prepull API beside the CSI socket.
	Prepull Prepull
	// Collect runs the cache's collector every Driver.GCInterval: set when a size cap or disk watermarks are.
	Collect bool
}

// Prepull configures the prepull API.
type Prepull struct {
	Enabled bool
	// Socket is the API's unix socket; empty: prepull.sock beside the CSI socket.
	Socket string
	// Concurrency is how many references are prepulled at once (at least 1).
	Concurrency int
	// Bandwidth caps the registry reads of all prepulls together, bytes per second (0: no cap).
	Bandwidth int64
}

// Run builds the node plugin and serves it until ctx ends.
func Run(ctx context.Context, o Options) error {
	log := o.Driver.Logger
	if log == nil {
		log = slog.Default()
		o.Driver.Logger = log
	}
	if o.Prepull.Enabled && o.Prepull.Concurrency < 1 {
		return fmt.Errorf("prepull concurrency %d: want at least 1", o.Prepull.Concurrency)
	}
	// A hosts.toml the pulls cannot use would fail every publish of its registry: refuse to start instead.
	if err := remote.ValidateHostsDir(o.Remote.HostsDir); err != nil {
		return fmt.Errorf("--hosts-dir: %w", err)
	}

	// 1. The store every model on the node is kept in.
	cacheRoot := filepath.Join(o.Root, "cache")
	o.Cache.Root, o.Cache.Logger = cacheRoot, log
	c, err := cache.Open(o.Cache)
	if err != nil {
		return fmt.Errorf("open cache: %w", err)
	}
	defer c.Close()
	o.Driver.Collectors = append(o.Driver.Collectors, c.Collector(), hostsReloadFailures)

	// 2. The trust policy, before anything that pulls: mounts and prepulls obey the same one.
	verifier, screen, metrics, err := trustPolicy(ctx, o, log)
	if err != nil {
		return err
	}
	if metrics != nil {
		o.Driver.Collectors = append(o.Driver.Collectors, metrics)
	}

	// 3. The one registry backend: the driver's pulls and prepulls share it, its verification and its scans.
	backend := cachebackend.New(c, cachebackend.Options{Remote: o.Remote, Verifier: verifier, Screen: screen})

	// 4. The driver. The prepull API starts with the driver's gRPC server, so that it records each prepull in the
	// driver as one of its own pulls (a pod mounting a prepulled tag with IfNotPresent needs no registry).
	o.Driver.StateDir = filepath.Join(o.Root, "csi")
	o.Driver.OwnDirs = append(o.Driver.OwnDirs, cacheRoot)
	o.Driver.Backend = backend
	serving := make(chan struct{})
	var once sync.Once
	o.Driver.GRPCServices = append(o.Driver.GRPCServices, func(*grpc.Server) { once.Do(func() { close(serving) }) })
	d, err := csidriver.New(o.Driver)
	if err != nil {
		return err
	}

	// 5. Prepull, through the same backend, and the cache's collector.
	if o.Prepull.Enabled {
		go servePrepull(ctx, serving, backend.Prepuller(d, o.Prepull.Bandwidth), o, log.With("component", "prepull"))
	}
	if o.Collect {
		go collect(ctx, c, o.Driver.GCInterval, log)
	}
	return d.Run(ctx)
}

// trustPolicy loads the node trust policy, reloaded as it changes, as the backend's verifier and scan policy and
// the verifier's metrics; all nil without one.
func trustPolicy(ctx context.Context, o Options, log *slog.Logger) (cachebackend.Verifier, cachebackend.ScanPolicy, prometheus.Collector, error) {
	if o.PolicyPath == "" {
		log.Warn("no --policy: model signatures are not verified and model files are not scanned")
		return nil, nil, nil, nil
	}
	p, err := signing.LoadPolicy(o.PolicyPath)
	if err != nil {
		return nil, nil, nil, err
	}
	// Signatures travel the model's transport: its TLS settings, hosts.toml and plain-HTTP list. The volume's pull
	// secret, in ctx (remote.WithCredential), reads them too, from the origin and from mirrors.
	reg, err := remote.NewTransports(o.Remote)
	if err != nil {
		return nil, nil, nil, err
	}
	v := signing.NewVerifier(p, reg)
	v.Log = log
	go v.WatchPolicy(ctx, o.PolicyPath, 0)
	log.Info("trust policy loaded", "path", o.PolicyPath, "version", p.Version())
	// A refusal wraps signing.ErrDenied, which is the driver's ErrDenied (PERMISSION_DENIED).
	// Rules scoped to namespaces apply to the publishing pod's (csidriver.PodNamespace; none for prepulls).
	verify := cachebackend.VerifierFunc(func(ctx context.Context, digestRef string) error {
		_, err := v.VerifyIn(ctx, csidriver.PodNamespace(ctx), digestRef)
		return err
	})
	return verify, currentPolicy{v}, v.Collector(), nil
}

// currentPolicy is the verifier's policy of the moment, as a scan policy: a reload applies to the next publish.
type currentPolicy struct{ v *signing.Verifier }

func (c currentPolicy) ScanNeeded(namespace, ref string) bool {
	return c.v.Policy().ScanNeededIn(namespace, ref)
}

func (c currentPolicy) AllowsScan(namespace, ref, path string, r scan.Report) error {
	return c.v.Policy().AllowsScanIn(namespace, ref, path, r)
}

// servePrepull serves the prepull API once the driver serves CSI, until ctx ends.
func servePrepull(ctx context.Context, serving <-chan struct{}, be prepull.Backend, o Options, log *slog.Logger) {
	select {
	case <-serving:
	case <-ctx.Done():
		return
	}
	socket := o.Prepull.Socket
	if socket == "" {
		socket = filepath.Join(filepath.Dir(strings.TrimPrefix(o.Driver.Endpoint, "unix://")), "prepull.sock")
	}
	if err := prepull.Serve(ctx, socket, be, prepull.Options{Concurrency: o.Prepull.Concurrency, Logger: log}); err != nil {
		log.Error("prepull API stopped", "error", err.Error())
	}
}

// collect keeps the cache under its size limit and its file system under the high watermark; volumes in use are
// never evicted.
func collect(ctx context.Context, c *cache.Cache, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := c.GC(ctx); err != nil && ctx.Err() == nil {
			log.Warn("cache collection failed", "error", err.Error())
		}
	}
}

// hostsReloadFailures exports remote.HostsReloadFailures: a hosts.toml turned invalid keeps serving its last good
// content, so the log line and this counter are how an operator learns that an edit did not take.
var hostsReloadFailures = prometheus.NewCounterFunc(prometheus.CounterOpts{
	Namespace: "modelpack_csi", Name: "hosts_reload_failures_total",
	Help: "Pulls that found a hosts.toml invalid and used its last good content instead.",
}, func() float64 { return float64(remote.HostsReloadFailures()) })
