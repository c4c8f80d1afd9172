package cli

import (
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/cache"
)

// benchResult is what `modelpack cache bench` measures, for e2e/bench-cache.sh.
type benchResult struct {
	PullSeconds      float64 `json:"pullSeconds"`      // Pull alone
	ViewSeconds      float64 `json:"viewSeconds"`      // the first Acquire: builds the view
	ColdSeconds      float64 `json:"coldSeconds"`      // Pull + first Acquire
	BlobBytes        int64   `json:"blobBytes"`        // bytes of blob responses received
	Files            int     `json:"files"`            // files in the view
	AssembleSeconds  float64 `json:"assembleSeconds"`  // median time to assemble a fresh view of the whole model
	NewVolumeSeconds float64 `json:"newVolumeSeconds"` // median Acquire of an existing view by a new volume
}

// cacheBenchCmd is hidden: it exists for the benchmark script, which needs in-process timings that a shell cannot
// take (a view assembles in milliseconds).
func cacheBenchCmd(f *cacheFlags) *cobra.Command {
	var plainHTTP bool
	var rounds, concurrency int
	cmd := &cobra.Command{
		Use:    "bench REF",
		Short:  "Time a cache pull and view assembly (for e2e/bench-cache.sh)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			// The driver's transport (artifact/remote), counting the blob bytes that cross the wire.
			var blobBytes atomic.Int64
			repo, ref, err := remote.NewRepository(args[0], remote.Options{
				PlainHTTP:     plainHTTP,
				WrapTransport: func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, &blobBytes} },
			})
			if err != nil {
				return err
			}
			desc, err := repo.Resolve(ctx, ref.Reference)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(f.root, 0o755); err != nil {
				return err
			}
			c, err := f.open(cache.Options{Concurrency: concurrency}, nil)
			if err != nil {
				return err
			}
			defer c.Close()
			var r benchResult
			start := time.Now()
			m, err := c.Pull(ctx, repo, desc, nil)
			if err != nil {
				return err
			}
			r.PullSeconds = time.Since(start).Seconds()
			vstart := time.Now()
			dir, err := c.Acquire("bench-0", m.Digest, cache.Selector{})
			if err != nil {
				return err
			}
			r.ViewSeconds = time.Since(vstart).Seconds()
			r.ColdSeconds = time.Since(start).Seconds()
			r.BlobBytes = blobBytes.Load()
			if r.Files, err = countFiles(dir); err != nil {
				return err
			}
			// Fresh assemblies of the whole model: a selector that keeps everything but names a distinct
			// view each round.
			var assemble, acquire []float64
			for i := range rounds {
				s := time.Now()
				if _, err := c.Acquire(fmt.Sprintf("bench-a%d", i), m.Digest, cache.Selector{Include: []string{"**", fmt.Sprintf("round-%d-%d", time.Now().UnixNano(), i)}}); err != nil {
					return err
				}
				assemble = append(assemble, time.Since(s).Seconds())
				s = time.Now()
				if _, err := c.Acquire(fmt.Sprintf("bench-v%d", i), m.Digest, cache.Selector{}); err != nil {
					return err
				}
				acquire = append(acquire, time.Since(s).Seconds())
			}
			r.AssembleSeconds, r.NewVolumeSeconds = medianOf(assemble), medianOf(acquire)
			// Leave the cache as a driver would after its volumes went away.
			refs, _ := c.Refs()
			for _, ref := range refs {
				c.Release(ref.Owner)
			}
			return PrintJSON(cmd.OutOrStdout(), r)
		},
	}
	cmd.Flags().BoolVar(&plainHTTP, "plain-http", false, "use HTTP, not HTTPS")
	cmd.Flags().IntVar(&rounds, "rounds", 5, "view assemblies to time")
	cmd.Flags().IntVar(&concurrency, "concurrency", 0, "blobs fetched at once (0 = the cache's default)")
	return cmd
}

type countingTransport struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (t countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err == nil && slices.Contains([]int{http.StatusOK, http.StatusPartialContent}, resp.StatusCode) && isBlobPath(req.URL.Path) {
		resp.Body = countingBody{resp.Body, t.n}
	}
	return resp, err
}

func isBlobPath(p string) bool { return strings.Contains(p, "/blobs/") }

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

func countFiles(dir string) (int, error) {
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return err
	})
	return n, err
}

func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
