package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gofrs/flock"
	digest "github.com/opencontainers/go-digest"
	"github.com/spf13/cobra"

	"github.com/modelpack/modelpack/cache"
	"github.com/modelpack/modelpack/prepull"
)

type cacheFlags struct {
	root        string
	lockTimeout time.Duration
}

func defaultCacheRoot() string {
	if r := os.Getenv("MODELPACK_CACHE_ROOT"); r != "" {
		return r
	}
	return "/var/lib/modelpack/cache"
}

// open opens the cache; what it logs (repairs after an unclean stop, damaged blobs) becomes warnings in ws, if
// given.
func (f *cacheFlags) open(opts cache.Options, ws *warnings) (*cache.Cache, error) {
	if _, err := os.Stat(f.root); err != nil {
		return nil, fmt.Errorf("cache root: %w", err)
	}
	// The driver's --root holds its cache in <root>/cache: a root given as the driver's is taken to mean that,
	// rather than opened (and initialised) as an empty cache of its own.
	if isCache(filepath.Join(f.root, "cache")) && !isCache(f.root) {
		f.root = filepath.Join(f.root, "cache")
	}
	opts.Root, opts.LockTimeout = f.root, f.lockTimeout
	if ws != nil {
		opts.Logger = ws.logger(slog.LevelInfo)
	}
	c, err := cache.Open(opts)
	if err != nil && heldElsewhere(f.root) {
		return nil, fmt.Errorf("%w; on a live node that is the CSI driver, which holds its cache while it runs: list that "+
			"cache through the driver with `modelpack cache ls --socket SOCKET` or `modelpack prepull cache --socket SOCKET` (on the node's host "+
			"/var/lib/kubelet/plugins/<driver name>/prepull.sock, in the driver's container %s); "+
			"du, gc, verify and rm need the driver stopped", err, prepull.DefaultSocket)
	}
	return c, err
}

// heldElsewhere reports whether another process holds the cache's metadata database: bbolt takes an exclusive
// flock on meta.db for as long as a writer has it open, and a shared lock cannot be had beside it.
func heldElsewhere(root string) bool {
	l := flock.New(filepath.Join(root, "meta.db"))
	ok, err := l.TryRLock()
	if err != nil {
		return false
	}
	if ok {
		_ = l.Unlock()
	}
	return !ok
}

// use opens the cache, runs fn on it and closes it before the command prints anything, so that what the cache
// logs until Close returns (the verification an unclean stop asks for starts in the background) is in ws.
func (f *cacheFlags) use(opts cache.Options, ws *warnings, fn func(*cache.Cache) error) error {
	c, err := f.open(opts, ws)
	if err != nil {
		return err
	}
	err = fn(c)
	return errors.Join(err, c.Close())
}

// isCache reports whether dir holds a cache's metadata.
func isCache(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "meta.db"))
	return err == nil
}

func cacheCmd(g *Globals) *cobra.Command {
	f := &cacheFlags{}
	cmd := &cobra.Command{
		Use:   "cache",
		Short: "Inspect and maintain a node cache (the CSI driver's content store)",
		Long: `Inspect and maintain a node cache: the blobs, extracted layers and read-only views the CSI driver serves.

A cache root is held by one process at a time: while the driver runs, these commands wait up to --lock-timeout
and then say so; list a live node's cache through the driver instead, with modelpack prepull cache --socket.`,
	}
	cmd.PersistentFlags().StringVar(&f.root, "root", defaultCacheRoot(), "cache directory (env MODELPACK_CACHE_ROOT); the driver's --root works too (its cache is <root>/cache)")
	cmd.PersistentFlags().DurationVar(&f.lockTimeout, "lock-timeout", 5*time.Second, "how long to wait for another process holding the cache")
	cmd.AddCommand(cacheLsCmd(g, f), cacheDuCmd(g, f), cacheGCCmd(g, f), cacheVerifyCmd(g, f), cacheRmCmd(g, f))
	return cmd
}

func cacheLsCmd(g *Globals, f *cacheFlags) *cobra.Command {
	var socket string
	cmd := &cobra.Command{
		Use: "ls",
		Example: `  modelpack cache ls --root /var/lib/modelpack
  modelpack cache ls -o json
  modelpack cache ls --socket /var/lib/kubelet/plugins/modelpack.csi.dev/prepull.sock   # a live node's, through its driver`,
		Short: "List the manifests in the cache, most recently used first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Under -o json ls prints a bare array, with no room for warnings: what opening the cache repaired
			// shows in the entries' states, and cache verify reports it.
			if socket != "" {
				return printDriverCache(cmd, g, socket) // the running driver holds the cache: ask it
			}
			var entries []cache.Entry
			err := f.use(cache.Options{}, newWarnings(cmd, g), func(c *cache.Cache) (err error) {
				entries, err = c.List()
				return err
			})
			if err != nil {
				return err
			}
			if g.IsJSON() {
				if entries == nil {
					entries = []cache.Entry{}
				}
				return PrintJSON(cmd.OutOrStdout(), entries)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "DIGEST\tTYPE\tSIZE\tSTATE\tREFS\tVIEWS\tLAST USED\tNAME")
			for _, e := range entries {
				kind := "model"
				if e.Image {
					kind = "image"
				}
				state := "complete"
				if !e.Complete {
					state = "partial"
				}
				refs := "-"
				if len(e.Refs) > 0 {
					refs = strings.Join(e.Refs, ",")
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", shortHex(e.Descriptor.Digest), kind, humanBytes(e.Size), state,
					refs, len(e.Views), ago(e.LastUsed), orDash(e.Name))
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVar(&socket, "socket", "", "list the cache of the driver running on this node, through its prepull socket (what modelpack prepull cache lists), instead of opening --root")
	return cmd
}

func cacheDuCmd(g *Globals, f *cacheFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "du",
		Example: `  modelpack cache du --root /var/lib/modelpack`,
		Short:   "Show what the cache holds on disk",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws := newWarnings(cmd, g)
			var u cache.Usage
			err := f.use(cache.Options{}, ws, func(c *cache.Cache) (err error) {
				u, err = c.Usage()
				return err
			})
			if err != nil {
				return err
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), struct {
					cache.Usage
					Warnings []string `json:"warnings,omitempty"`
				}{u, ws.all()})
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "blobs\t%d\t%s\n", u.BlobCount, humanBytes(u.Blobs))
			fmt.Fprintf(w, "extracted layers\t%d\t%s\n", u.LayerCount, humanBytes(u.Layers))
			fmt.Fprintf(w, "partial downloads\t\t%s\n", humanBytes(u.Partials))
			fmt.Fprintf(w, "total\t\t%s\n", humanBytes(u.Bytes))
			fmt.Fprintf(w, "in use\t\t%s\n", humanBytes(u.Referenced))
			fmt.Fprintf(w, "manifests\t%d\t\n", u.Manifests)
			fmt.Fprintf(w, "views\t%d\t\n", u.Views)
			fmt.Fprintf(w, "references\t%d\t\n", u.Refs)
			return w.Flush()
		},
	}
}

func cacheGCCmd(g *Globals, f *cacheFlags) *cobra.Command {
	var maxSize string
	var minAge time.Duration
	var high, low int
	cmd := &cobra.Command{
		Use: "gc",
		Example: `  modelpack cache gc --root /var/lib/modelpack --max-size 100GiB
  modelpack cache gc --root /var/lib/modelpack --high-watermark 85 --low-watermark 80`,
		Short: "Evict least recently used, unreferenced manifests down to --max-size and delete unneeded content",
		Long: `Evict least recently used manifests that no volume or pin references until the cache fits --max-size, then
delete every blob, extracted layer, view and partial download that no remaining manifest needs. With --max-size 0
nothing is evicted; only unneeded content is deleted. With --high-watermark, once the cache's file system is that
percent used (statfs, as df shows) manifests are evicted until it would be --low-watermark percent used; with
--max-size too, both apply and whichever asks for the smaller cache wins.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			max, err := parseByteSize(maxSize)
			if err != nil {
				return usageErr("--max-size: %w", err)
			}
			if err := cache.CheckWatermarks(high, low, "--high-watermark", "--low-watermark"); err != nil {
				return usageErr("%w", err)
			}
			if minAge == 0 {
				minAge = -1 // cache.Options: negative means no protection
			}
			ws := newWarnings(cmd, g)
			var st cache.GCStats
			err = f.use(cache.Options{MaxBytes: max, HighWatermark: high, LowWatermark: low, MinAge: minAge}, ws, func(c *cache.Cache) (err error) {
				st, err = c.GC(cmd.Context())
				return err
			})
			if err != nil {
				return err
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), struct {
					cache.GCStats
					Warnings []string `json:"warnings,omitempty"`
				}{st, ws.all()})
			}
			out := cmd.OutOrStdout()
			for _, d := range st.Evicted {
				fmt.Fprintf(out, "evicted %s\n", d)
			}
			fmt.Fprintf(out, "deleted %d blobs, %d layers, %d views, %d partial downloads; %s -> %s in %s\n",
				st.Blobs, st.Layers, st.Views, st.Partials, humanBytes(st.Before), humanBytes(st.After), st.Duration.Round(time.Millisecond))
			return nil
		},
	}
	cmd.Flags().StringVar(&maxSize, "max-size", "0", "evict down to this size (e.g. 100GiB; 0 = evict nothing)")
	cmd.Flags().DurationVar(&minAge, "min-age", 0, "never evict content used more recently than this")
	cmd.Flags().IntVar(&high, "high-watermark", 0, "percent of the cache's file system used at which manifests are evicted (1 to 100; 0 = off)")
	cmd.Flags().IntVar(&low, "low-watermark", 0, "percent of the cache's file system to evict down to (0 to below --high-watermark)")
	return cmd
}

func cacheVerifyCmd(g *Globals, f *cacheFlags) *cobra.Command {
	var repair bool
	cmd := &cobra.Command{
		Use: "verify",
		Example: `  modelpack cache verify --root /var/lib/modelpack
  modelpack cache verify --root /var/lib/modelpack --repair`,
		Short: "Re-hash every blob and check every manifest has its content; exits 1 on any problem",
		Long: `Re-hash every blob and check every manifest has its content; exits 1 on any problem.

With --repair, damaged blobs are quarantined (moved to quarantine/ under the cache root, deleted by the next gc),
the manifests that need them are marked incomplete so that the next publish pulls them again, and the views and
extracted layers built from them are deleted. The driver also does this on its own: a blob that is missing, of the
wrong size, or whose file changed since its bytes were verified (its stamp: inode, size, mtime, ctime) is caught
on every use, every blob is re-hashed before its next use after an unclean start, and a background scrub
re-hashes every blob every --cache-verify-interval at --cache-scrub-rate.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws := newWarnings(cmd, g)
			var rep cache.VerifyReport
			err := f.use(cache.Options{}, ws, func(c *cache.Cache) (err error) {
				verify := c.Verify
				if repair {
					verify = c.Repair
				}
				rep, err = verify(cmd.Context())
				return err
			})
			if err != nil {
				return err
			}
			if g.IsJSON() {
				if err := PrintJSON(cmd.OutOrStdout(), struct {
					cache.VerifyReport
					Warnings []string `json:"warnings,omitempty"`
				}{rep, ws.all()}); err != nil {
					return err
				}
			} else {
				out := cmd.OutOrStdout()
				for _, p := range rep.Problems {
					fmt.Fprintf(out, "%s: %s\n", p.Digest, p.What)
				}
				fmt.Fprintf(out, "verified %d blobs (%s): %d problems\n", rep.Blobs, humanBytes(rep.Bytes), len(rep.Problems))
				if repair && len(rep.Repaired) > 0 {
					fmt.Fprintf(out, "repaired: %d blobs quarantined; the next publish pulls them again\n", len(rep.Repaired))
				}
			}
			if len(rep.Problems) > 0 {
				return fmt.Errorf("%d problems", len(rep.Problems))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&repair, "repair", false, "quarantine damaged blobs so the next publish pulls them again")
	return cmd
}

func cacheRmCmd(g *Globals, f *cacheFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "rm DIGEST...",
		Example: `  modelpack cache rm --root /var/lib/modelpack sha256:3f1c…`,
		Short:   "Remove manifests (by digest or unique prefix) and the content only they use; refused while referenced",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ws := newWarnings(cmd, g)
			var removed []digest.Digest
			err := f.use(cache.Options{}, ws, func(c *cache.Cache) error {
				entries, err := c.List()
				if err != nil {
					return err
				}
				for _, a := range args {
					d, err := matchDigest(entries, a)
					if err != nil {
						return err
					}
					if err := c.Remove(d); err != nil {
						return err
					}
					removed = append(removed, d)
				}
				return nil
			})
			if !g.IsJSON() {
				for _, d := range removed { // those removed before an error too
					fmt.Fprintf(cmd.OutOrStdout(), "removed %s\n", d)
				}
				return err
			}
			if err != nil {
				return err
			}
			return PrintJSON(cmd.OutOrStdout(), struct {
				Removed  []digest.Digest `json:"removed"`
				Warnings []string        `json:"warnings,omitempty"`
			}{removed, ws.all()})
		},
	}
}

// matchDigest resolves a full digest, or a unique prefix of a manifest's or index's hex, as ls prints them.
func matchDigest(entries []cache.Entry, s string) (digest.Digest, error) {
	s = strings.TrimPrefix(s, "sha256:")
	var found []digest.Digest
	for _, e := range entries {
		for _, d := range append([]digest.Digest{e.Descriptor.Digest}, e.Indexes...) {
			if strings.HasPrefix(d.Encoded(), s) && len(s) > 0 {
				found = append(found, e.Descriptor.Digest)
				break
			}
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("%s: %w", s, cache.ErrNotFound)
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("%s matches %d manifests: give more of the digest", s, len(found))
}

func shortHex(d digest.Digest) string {
	if e := d.Encoded(); len(e) > 12 {
		return e[:12]
	}
	return d.Encoded()
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}
