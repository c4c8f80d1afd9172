package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/modelpack/modelpack/csidriver"
	"github.com/modelpack/modelpack/prepull"
)

type prepullFlags struct {
	socket, file, list string
	detach             bool
	timeout            time.Duration

	watch, metricsAddr, nodeName string
	poll, resync                 time.Duration
	logFormat, logLevel          string
}

func prepullCmd(g *Globals) *cobra.Command {
	f := &prepullFlags{}
	cmd := &cobra.Command{
		Use: "prepull [REF...]",
		Example: `  modelpack prepull registry.example.com/models/llama3:8b
  modelpack prepull --file models.yaml`,
		Short: "Pull models into this node's cache ahead of the pods that mount them, and keep them pinned",
		Long: `Ask the CSI driver on this node to pull models into its cache before any pod mounts them. The driver checks
them against its trust policy first, exactly as for a mount, and pins them so cache GC keeps them until they are
cancelled or, in --watch mode, leave the list.

  modelpack prepull registry.example.com/models/llama3:8b     # pull, pin, show progress until ready
  modelpack prepull --file models.yaml                        # every reference in a list file
  modelpack prepull status                                     # what is listed and where it stands
  modelpack prepull cache                                      # the node cache and what holds each model
  modelpack prepull cancel registry.example.com/models/llama3:8b

List file (also the ConfigMap format of the prepull DaemonSet):

  models:
    - registry.example.com/models/llama3:8b
    - ref: registry.example.com/models/qwen2@sha256:...

--watch FILE is the DaemonSet mode: FILE (a mounted ConfigMap key, mounted without subPath so updates arrive)
is re-read every --poll and the list on the driver is made equal to it: new references are pulled, removed ones
cancelled and unpinned. Per-reference state (pending, pulling N%, ready, failed: reason) is logged and served as
Prometheus metrics on --metrics-addr. It needs no Kubernetes API access.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.watch != "" {
				if len(args) > 0 || f.file != "" {
					return errors.New("--watch takes no references and no --file: the watched file is the list")
				}
				return runPrepullWatch(cmd.Context(), f)
			}
			refs := args
			if f.file != "" {
				fromFile, err := prepull.ReadList(f.file)
				if err != nil {
					return err
				}
				refs = append(refs, fromFile...)
			}
			if len(refs) == 0 {
				return errors.New("no references: give REF arguments, --file or --watch")
			}
			return runPrepull(cmd, g, f, refs)
		},
	}
	fl := cmd.PersistentFlags()
	fl.StringVar(&f.socket, "socket", envOr("MODELPACK_PREPULL_SOCKET", prepull.DefaultSocket),
		"the driver's prepull socket; on a node's host: /var/lib/kubelet/plugins/<driver>/prepull.sock (env MODELPACK_PREPULL_SOCKET)")
	fl.StringVar(&f.list, "list", "", "list the references belong to (default \"cli\"; \"configmap\" with --watch)")
	l := cmd.Flags()
	l.StringVarP(&f.file, "file", "f", "", "read references from a list file (YAML)")
	l.BoolVar(&f.detach, "detach", false, "return once the references are queued instead of following them")
	l.DurationVar(&f.timeout, "timeout", 0, "stop following after this long (the pulls go on; 0 = until done)")
	l.StringVar(&f.watch, "watch", "", "DaemonSet mode: keep the list equal to this file, reconciling on every change")
	l.StringVar(&f.metricsAddr, "metrics-addr", csidriver.DefaultMetricsAddr("9809"), "with --watch: address serving /metrics, /healthz and /readyz (empty disables; default: $POD_IP, else 127.0.0.1)")
	l.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "with --watch: node label on the metrics (env NODE_NAME)")
	l.DurationVar(&f.poll, "poll", 2*time.Second, "with --watch: how often the file is re-read")
	l.DurationVar(&f.resync, "resync", time.Minute, "with --watch: how often the list is sent again unchanged, restoring a restarted driver")
	l.StringVar(&f.logFormat, "log-format", "json", "with --watch: log format, json or text")
	l.StringVar(&f.logLevel, "log-level", "info", "with --watch: log level")
	cmd.AddCommand(prepullStatusCmd(g, f), prepullCancelCmd(g, f), prepullCacheCmd(g, f))
	return cmd
}

func (f *prepullFlags) listOr(def string) string {
	if f.list != "" {
		return f.list
	}
	return def
}

func runPrepull(cmd *cobra.Command, g *Globals, f *prepullFlags, refs []string) error {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := prepull.NewClient(f.socket)
	list := f.listOr(prepull.DefaultList)
	s, err := c.Add(ctx, list, refs)
	if err != nil {
		return err
	}
	if !f.detach {
		follow := ctx
		if f.timeout > 0 {
			var cancel context.CancelFunc
			follow, cancel = context.WithTimeout(ctx, f.timeout)
			defer cancel()
		}
		s, err = followPrepull(follow, c, list, refs, s, progressPrinter(cmd.ErrOrStderr(), g))
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("stopped following (the pulls go on in the driver; see `modelpack prepull status`): %w", err)
			}
			return err
		}
	}
	mine := pick(s.Entries, refs)
	if g.IsJSON() {
		if err := PrintJSON(cmd.OutOrStdout(), mine); err != nil {
			return err
		}
	} else if (!g.Quiet || f.detach) && !(g.ShowProgress() && !f.detach && isTerminal(cmd.OutOrStdout())) {
		// On a terminal the live lines already end on the final state; a table would repeat them.
		printEntries(cmd.OutOrStdout(), mine, false)
	}
	if f.detach {
		return nil
	}
	var failed []string
	for _, e := range mine {
		if e.State == prepull.StateFailed {
			failed = append(failed, e.Ref+": "+e.Error)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d failed (the driver retries them):\n  %s", len(failed), len(mine), strings.Join(failed, "\n  "))
	}
	return nil
}

// followPrepull long-polls the driver until every ref is ready or failed, reporting each snapshot.
func followPrepull(ctx context.Context, c *prepull.Client, list string, refs []string, s prepull.Snapshot, report func([]prepull.Entry)) (prepull.Snapshot, error) {
	for {
		mine := pick(s.Entries, refs)
		report(mine)
		settled := len(mine) == len(refs)
		for _, e := range mine {
			if e.State != prepull.StateReady && e.State != prepull.StateFailed {
				settled = false
			}
		}
		if settled {
			return s, nil
		}
		next, err := c.Entries(ctx, list, s.Version)
		if err != nil {
			return s, err
		}
		if next.Version < s.Version {
			return s, errors.New("the driver restarted; run the command again to re-queue")
		}
		s = next
	}
}

// pick returns the entries of refs, in the order given.
func pick(entries []prepull.Entry, refs []string) []prepull.Entry {
	by := map[string]prepull.Entry{}
	for _, e := range entries {
		by[e.Ref] = e
	}
	out := make([]prepull.Entry, 0, len(refs))
	seen := map[string]bool{}
	for _, r := range refs {
		if e, ok := by[r]; ok && !seen[r] {
			out = append(out, e)
			seen[r] = true
		}
	}
	return out
}

// progressPrinter redraws one line per reference on a terminal, and elsewhere prints a line per change of state
// (and per 10% of progress), so logs of scripted runs stay short.
func progressPrinter(w io.Writer, g *Globals) func([]prepull.Entry) {
	if g.Quiet || g.IsJSON() {
		return func([]prepull.Entry) {}
	}
	if g.ShowProgress() {
		drawn := 0
		var last time.Time
		return func(es []prepull.Entry) {
			settled := true
			for _, e := range es {
				settled = settled && (e.State == prepull.StateReady || e.State == prepull.StateFailed)
			}
			// Redrawing faster than a terminal refresh only costs CPU; the final state is always drawn.
			if !settled && time.Since(last) < 100*time.Millisecond {
				return
			}
			last = time.Now()
			if drawn > 0 {
				fmt.Fprintf(w, "\x1b[%dA", drawn)
			}
			for _, e := range es {
				fmt.Fprintf(w, "\r\x1b[K%s  %s\n", e.Ref, progressText(e))
			}
			drawn = len(es)
		}
	}
	logged := map[string]string{}
	return func(es []prepull.Entry) {
		for _, e := range es {
			key := e.Status()
			if e.State == prepull.StatePulling {
				key = fmt.Sprintf("pulling %d", e.Percent()/10)
			}
			if logged[e.Ref] == key {
				continue
			}
			logged[e.Ref] = key
			fmt.Fprintf(w, "%s: %s\n", e.Ref, progressText(e))
		}
	}
}

func progressText(e prepull.Entry) string {
	switch {
	case e.State == prepull.StatePulling && e.Total > 0:
		return fmt.Sprintf("%s (%s / %s)", e.Status(), humanBytes(e.Done), humanBytes(e.Total))
	case e.State == prepull.StateReady && e.Total > 0:
		return fmt.Sprintf("ready (%s)", humanBytes(e.Total))
	}
	return e.Status()
}

func printEntries(w io.Writer, es []prepull.Entry, withList bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if withList {
		fmt.Fprint(tw, "LIST\t")
	}
	fmt.Fprintln(tw, "REFERENCE\tSTATE\tSIZE\tDIGEST\tREASON")
	for _, e := range es {
		if withList {
			fmt.Fprintf(tw, "%s\t", e.List)
		}
		size := "-"
		if e.Total > 0 {
			size = humanBytes(e.Total)
		}
		d := "-"
		if e.Digest != "" {
			d = e.Digest.String()
		}
		// The reason goes last: registry errors are long and would stretch every column after them.
		state := e.Status()
		if e.State == prepull.StateFailed {
			state = string(e.State)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.Ref, state, size, d, e.Error)
	}
	tw.Flush()
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func prepullStatusCmd(g *Globals, f *prepullFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "status",
		Example: `  modelpack prepull status --socket /var/lib/kubelet/plugins/modelpack.csi.dev/prepull.sock`,
		Short:   "Show the prepull lists on this node and where each reference stands",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := prepull.NewClient(f.socket).Entries(cmd.Context(), f.list, 0)
			if err != nil {
				return err
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), s.Entries)
			}
			printEntries(cmd.OutOrStdout(), s.Entries, true)
			return nil
		},
	}
}

func prepullCancelCmd(g *Globals, f *prepullFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "cancel REF...",
		Example: `  modelpack prepull cancel registry.example.com/models/llama3:8b -o json`,
		Short:   "Stop prepulling references and unpin them (the cache may then evict them)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := prepull.NewClient(f.socket)
			list := f.listOr(prepull.DefaultList)
			var cancelled []string
			for _, r := range args {
				if err := c.Remove(cmd.Context(), list, r); err != nil {
					if len(cancelled) > 0 {
						return fmt.Errorf("cancelled %s; %s: %w", strings.Join(cancelled, ", "), r, err)
					}
					return err
				}
				cancelled = append(cancelled, r)
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), prepullCancelJSON{List: list, Cancelled: cancelled})
			}
			return nil
		},
	}
}

// prepullCancelJSON is prepull cancel's result: the references taken off list, in the order given.
type prepullCancelJSON struct {
	List      string   `json:"list"`
	Cancelled []string `json:"cancelled"`
}

// prepullCacheCmd lists the cache through the running driver, which holds the cache's lock: `modelpack cache ls`
// can only open it while the driver is stopped.
func prepullCacheCmd(g *Globals, f *prepullFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "cache",
		Example: `  modelpack prepull cache -o json`,
		Short:   "List the running driver's node cache: each model, its size and what holds it (pins, volumes)",
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return printDriverCache(cmd, g, f.socket) },
	}
}

// printDriverCache lists the cache of the driver serving socket: prepull cache, and cache ls --socket on a live
// node.
func printDriverCache(cmd *cobra.Command, g *Globals, socket string) error {
	es, err := prepull.NewClient(socket).Cache(cmd.Context())
	if err != nil {
		return err
	}
	if g.IsJSON() {
		return PrintJSON(cmd.OutOrStdout(), es)
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DIGEST\tSIZE\tSTATE\tHELD BY\tLAST USED\tNAME")
	for _, e := range es {
		state, held := "partial", "-"
		if e.Complete {
			state = "complete"
		}
		if len(e.Owners) > 0 {
			held = strings.Join(e.Owners, ",")
		} else if e.Complete {
			held = "- (evictable)"
		}
		used := "-"
		if !e.LastUsed.IsZero() {
			used = e.LastUsed.Local().Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Digest, humanBytes(e.Size), state, held, used, e.Name)
	}
	return tw.Flush()
}

func runPrepullWatch(parent context.Context, f *prepullFlags) error {
	log, err := newLogger(f.logFormat, f.logLevel)
	if err != nil {
		return err
	}
	if parent == nil {
		parent = context.Background()
	}
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	w := &prepull.Watcher{
		Client:  prepull.NewClient(f.socket),
		File:    f.watch,
		List:    f.listOr("configmap"),
		Poll:    f.poll,
		Resync:  f.resync,
		Log:     log,
		Metrics: prepull.NewWatchMetrics(reg, f.nodeName),
	}
	if f.metricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		// The readiness probe: 200 only when this node holds every listed model, so `kubectl rollout status`
		// waits for the fleet; the body names what lags and why (the kubelet event shows only the status code:
		// the reasons are in this pod's log, one line per failed entry).
		mux.HandleFunc("/readyz", func(rw http.ResponseWriter, _ *http.Request) {
			ok, why := w.Ready()
			if !ok {
				rw.WriteHeader(http.StatusServiceUnavailable)
			}
			fmt.Fprintln(rw, why)
		})
		l, err := net.Listen("tcp", f.metricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(l)
		defer srv.Close()
		log.Info("prepull metrics listening", "addr", l.Addr().String())
	}
	log.Info("prepull watching", "file", f.watch, "socket", f.socket, "list", w.List, "node", f.nodeName)
	return w.Run(ctx)
}
