package csidriver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"

	"github.com/modelpack/modelpack/csidriver/access"
	"github.com/modelpack/modelpack/csidriver/state"
	"github.com/modelpack/modelpack/internal/readahead"
	"github.com/modelpack/modelpack/internal/unixsock"
)

// Defaults the deployment manifests rely on.
const (
	DefaultDriverName = "modelpack.csi.dev"
	DefaultEndpoint   = "unix:///csi/csi.sock"
)

// DefaultMetricsAddr is where metrics listen unless told: the pod's own address (the POD_IP environment variable,
// from the downward API; the node's address with the host network), else loopback. Never every interface, as the
// CSI sidecars do it.
func DefaultMetricsAddr(port string) string {
	host := os.Getenv("POD_IP")
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// Options configure a Driver.
type Options struct {
	// DriverName is the CSI driver name (DefaultDriverName).
	DriverName string
	// Version is reported by GetPluginInfo.
	Version string
	// NodeID is reported by NodeGetInfo; the Kubernetes node name.
	NodeID string
	// Endpoint is where the CSI services listen: unix:///path/to/csi.sock (or a plain path).
	Endpoint string
	// StateDir holds the persisted state (package state: state.db, and this boot's volume records under volumes/).
	StateDir string
	// OwnDirs are the other directories the driver keeps content in (the cache root): no target may lie in or
	// over them or StateDir, and a mount left on a target the state does not know is taken off only when it is
	// a view from one of them.
	OwnDirs []string
	// Backend is the node cache and registry transport.
	Backend Backend
	// MetricsAddr, if set, serves /metrics, /healthz and HTTPHandlers over HTTP.
	MetricsAddr string
	// Logger receives structured logs; slog.Default() if nil.
	Logger *slog.Logger
	// Mounter does the mounts; mount-utils (without systemd) with bind mounts as system calls if nil.
	Mounter mount.Interface
	// GCInterval is how often volumes whose pods vanished are looked for after start-up (5 minutes if zero).
	GCInterval time.Duration
	// GRPCServices register extra services on the driver's gRPC server (the seam for other node features).
	GRPCServices []func(*grpc.Server)
	// HTTPHandlers are extra handlers on the metrics server, by pattern.
	HTTPHandlers map[string]http.Handler
	// Collectors are extra Prometheus collectors served on /metrics (the cache's own).
	Collectors []prometheus.Collector
	// Readahead is the budget of the readahead each publish starts of its volume's files (package readahead);
	// nil turns it off. ReadaheadWait holds it for that long, and drops it if the pod opens a file of the volume
	// meanwhile (readahead.Options.WaitForOpen; 0: it starts at the mount).
	Readahead     readahead.Budget
	ReadaheadWait time.Duration
	// AccessPolicy decides when content on the node is shared with a caller without asking the registry
	// (kubelet's imagePullCredentialsVerificationPolicy); the zero value is access.DefaultMode.
	AccessPolicy access.Policy
}

// Driver is a running CSI plugin.
type Driver struct {
	opts    Options
	log     *slog.Logger
	backend Backend
	mounter mount.Interface
	state   *state.Store
	// access records which credentials the registries served each cached digest to, under which name.
	access *access.Store
	m      *metrics
	pulls  *puller
	// ahead reads published volumes into the page cache; nil when Options.Readahead is.
	ahead *readahead.Reader
	// running is closed once Run has made pulls and ahead, which Wait then reads.
	running chan struct{}
	// stateLost is set when the persisted state was unreadable at start: view holds that no volume record accounts
	// for may then belong to volumes still mounted in pods, so they are released only by those volumes' unpublish.
	stateLost bool

	// targets serialises operations on one target path: a second concurrent call on a target gets ABORTED, a call
	// finding the background reconciler on it waits for it.
	targetsMu sync.Mutex
	targets   map[string]*targetHold

	ids *identityServer
	ns  *nodeServer
	cs  *controllerServer

	hooks testHooks // tests only (testing.go)
}

// New opens the driver's state and builds its services; Run serves them.
func New(opts Options) (*Driver, error) {
	if opts.DriverName == "" {
		opts.DriverName = DefaultDriverName
	}
	if opts.NodeID == "" {
		return nil, errors.New("csidriver: a node id is required")
	}
	if opts.Backend == nil {
		return nil, errors.New("csidriver: a backend is required")
	}
	if opts.StateDir == "" {
		return nil, errors.New("csidriver: a state directory is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Mounter == nil {
		opts.Mounter = newBindMounter()
	}
	if opts.GCInterval == 0 {
		opts.GCInterval = 5 * time.Minute
	}
	log := opts.Logger.With("driver", opts.DriverName, "node", opts.NodeID)
	st, err := state.Open(opts.StateDir)
	var corrupt *state.CorruptError
	if errors.As(err, &corrupt) {
		log.Error("persisted state was unreadable and was set aside; unknown mounts are cleaned when unpublished", "error", err.Error())
	} else if err != nil {
		return nil, fmt.Errorf("csidriver: open state: %w", err)
	}
	if opts.AccessPolicy.Mode == "" {
		opts.AccessPolicy.Mode = access.DefaultMode
	}
	acc, dropped, err := access.Open(opts.StateDir, st)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("csidriver: open access records: %w", err)
	}
	for _, k := range dropped {
		log.Info("a pull cut short recorded no access; its callers check with the registry at their next publish", "content", k.String())
	}
	d := &Driver{
		running:   make(chan struct{}),
		access:    acc,
		opts:      opts,
		log:       log,
		backend:   phased{opts.Backend, log},
		mounter:   opts.Mounter,
		state:     st,
		stateLost: corrupt != nil,
		targets:   map[string]*targetHold{},
	}
	d.m = newMetrics(opts.Backend, func() int { return len(st.Snapshot().Volumes) }, opts.Collectors)
	d.ids = &identityServer{d: d}
	d.ns = &nodeServer{d: d}
	d.cs = &controllerServer{d: d}
	return d, nil
}

// Run recovers the state left by an earlier run, serves the CSI services until ctx ends, then stops. Pulls run
// under ctx: they stop with it and resume, from their partial downloads, when the driver next starts.
func (d *Driver) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d.pulls = &puller{
		ctx: ctx, backend: d.backend, log: d.log, m: d.m, jobs: map[string]*pullJob{},
		started: d.recordPullStarted, finished: d.recordPullFinished,
	}
	if d.opts.Readahead != nil {
		d.ahead = readahead.New(ctx, readahead.Options{Budget: d.opts.Readahead, WaitForOpen: d.opts.ReadaheadWait,
			Done: d.readaheadDone, Gate: d.readaheadGate})
	}
	close(d.running)
	// Whatever ends Run, the state is closed last, once nothing uses it.
	var gc sync.WaitGroup
	defer func() {
		cancel()
		d.Wait()
		gc.Wait()
		if err := d.state.Close(); err != nil {
			d.log.Error("close state", "error", err.Error())
		}
	}()
	d.recover(ctx)

	lis, err := listen(d.opts.Endpoint, d.log)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(d.intercept))
	csi.RegisterIdentityServer(srv, d.ids)
	csi.RegisterNodeServer(srv, d.ns)
	csi.RegisterControllerServer(srv, d.cs)
	for _, reg := range d.opts.GRPCServices {
		reg(srv)
	}

	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(lis) }()
	var hsrv *http.Server
	if d.opts.MetricsAddr != "" {
		hl, err := net.Listen("tcp", d.opts.MetricsAddr)
		if err != nil {
			srv.Stop()
			return fmt.Errorf("csidriver: metrics listener: %w", err)
		}
		hsrv = &http.Server{Handler: d.httpHandler(), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := hsrv.Serve(hl); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("csidriver: metrics server: %w", err)
			}
		}()
	}
	gc.Add(1)
	go func() { defer gc.Done(); d.gcLoop(ctx) }()
	d.log.Info("csi driver serving", "endpoint", d.opts.Endpoint, "metrics", d.opts.MetricsAddr, "state", d.state.Path())

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	cancel()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		srv.Stop()
	}
	if hsrv != nil {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		hsrv.Shutdown(sctx)
		scancel()
	}
	d.Wait()
	d.log.Info("csi driver stopped")
	return runErr
}

func (d *Driver) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(d.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := d.backend.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	for pattern, h := range d.opts.HTTPHandlers {
		mux.Handle(pattern, h)
	}
	return mux
}

// intercept logs and counts every call. Requests are never logged whole: they carry secrets.
func (d *Driver) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
	code := status.Code(err)
	d.m.rpcs.WithLabelValues(method, code.String()).Inc()
	d.m.rpcDuration.WithLabelValues(method).Observe(time.Since(start).Seconds())
	d.logCall(method, start, code)
	if err != nil && code != codes.Aborted {
		d.log.Debug("csi call failed", "method", method, "code", code.String(), "error", status.Convert(err).Message())
	}
	return resp, err
}

type targetHold struct {
	rpc      bool
	released chan struct{}
}

// lockTarget claims a target path for a CSI call. False means another call holds it (the caller returns ABORTED,
// as the spec asks for an operation already pending); the background reconciler is waited for instead, since
// kubelet did nothing wrong.
func (d *Driver) lockTarget(ctx context.Context, target string) bool {
	for {
		d.targetsMu.Lock()
		h, held := d.targets[target]
		if !held {
			d.targets[target] = &targetHold{rpc: true, released: make(chan struct{})}
			d.targetsMu.Unlock()
			return true
		}
		d.targetsMu.Unlock()
		if h.rpc {
			return false
		}
		select {
		case <-h.released:
		case <-ctx.Done():
			return false
		}
	}
}

// tryLockTarget claims a target path for the background reconciler, which skips targets in use.
func (d *Driver) tryLockTarget(target string) bool {
	d.targetsMu.Lock()
	defer d.targetsMu.Unlock()
	if _, held := d.targets[target]; held {
		return false
	}
	d.targets[target] = &targetHold{released: make(chan struct{})}
	return true
}

func (d *Driver) unlockTarget(target string) {
	d.targetsMu.Lock()
	defer d.targetsMu.Unlock()
	if h, ok := d.targets[target]; ok {
		delete(d.targets, target)
		close(h.released)
	}
}

// Wait blocks until every pull and readahead the driver started has ended (for tests and orderly shutdown).
func (d *Driver) Wait() {
	<-d.running
	d.pulls.wg.Wait()
	if d.ahead != nil {
		d.ahead.Wait()
	}
}

func listen(endpoint string, log *slog.Logger) (net.Listener, error) {
	path := endpoint
	if strings.Contains(endpoint, "://") {
		u, err := url.Parse(endpoint)
		if err != nil {
			return nil, fmt.Errorf("csidriver: endpoint %q: %w", endpoint, err)
		}
		if u.Scheme != "unix" {
			return nil, fmt.Errorf("csidriver: endpoint %q: only unix sockets are served", endpoint)
		}
		path = u.Host + u.Path
	}
	if path == "" {
		return nil, fmt.Errorf("csidriver: endpoint %q has no socket path", endpoint)
	}
	// Whoever reaches the socket can mount models anywhere on the node: it is root's alone (package unixsock).
	l, err := unixsock.Listen(path, log)
	if err != nil {
		return nil, fmt.Errorf("csidriver: %w", err)
	}
	return l, nil
}
