package main

import (
	"context"
	"errors"
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

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"

	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/cache"
	"github.com/modelpack/modelpack/internal/bench"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// benchCache: the node cache. A cold pull + view of the benchmark model against a plain parallel curl of its blobs
// (medians of RUNS (5) rotated rounds), warm view assembly for a 10 MiB model and the benchmark model, view
// assembly for a 1,000-file model, and the bytes a new model version costs when one shard changed. The cache runs
// in this process, as in the driver, so a view (milliseconds) is timed around the calls themselves.
func benchCache(e *env) error {
	runs := envInt("RUNS", 5)
	c, blobs, err := e.scratch("cache")
	if err != nil {
		return err
	}
	defer os.RemoveAll(c)
	root, curlDir := filepath.Join(c, "root"), filepath.Join(c, "curl")

	var curlRuns, curlsRuns, coldRuns []float64
	var cold cacheResult
	curl := func(into *[]float64, durable bool) func() error {
		return func() error {
			// Deleting the previous run's download is part of no timing (with discard mounts it takes seconds).
			os.RemoveAll(curlDir)
			s, err := bench.Time(func() error { return blobs.curlAll(curlDir, durable) })
			*into = append(*into, s)
			return err
		}
	}
	// A cold pull into an empty cache root, then the first view: what a node does for the first pod of a model.
	// The figure is the clock around Pull and Acquire: closing the cache waits for the background flush (a driver
	// stopping does too), which no pod waits for.
	runCold := func() (err error) {
		fresh(root)
		cold, err = cacheBench(root, e.ref, 1)
		coldRuns = append(coldRuns, cold.ColdSeconds)
		return err
	}
	for i := 1; i <= runs; i++ {
		// The durable curl: the same download made durable before it is used (the cache uses verified blobs at
		// once and makes them durable in the background, see cas/durable.go).
		if err := bench.Rotate(i, curl(&curlRuns, false), curl(&curlsRuns, true), runCold); err != nil {
			return err
		}
	}
	os.RemoveAll(curlDir)
	tCurl, tCurls, tCold := bench.Median(curlRuns), bench.Median(curlsRuns), bench.Median(coldRuns)
	big, err := cacheBench(root, e.ref, 9)
	if err != nil {
		return err
	}

	// A 10 MiB model (4 shards of 2.5 MiB) and a 1,000-file model, each pulled into a fresh root.
	reg := e.registry.Host
	small, err := pulledModel(e, filepath.Join(c, "small"), testmodel.Spec{Shards: 4, ShardSize: 2560 << 10, Seed: 1}, reg+"/bench/small:v1", filepath.Join(c, "small-root"), 9)
	if err != nil {
		return err
	}
	many, err := pulledModel(e, filepath.Join(c, "many"), testmodel.Spec{Shards: 1, ShardSize: 1 << 20, Seed: 1, Files: 1000}, reg+"/bench/many:v1", filepath.Join(c, "many-root"), 9)
	if err != nil {
		return err
	}

	// A new version of the benchmark model whose last shard changed: pulled into the root that holds the first.
	changedDir := filepath.Join(c, "changed")
	if err := linkTree(e.modelDir, changedDir); err != nil {
		return err
	}
	shards, _ := filepath.Glob(filepath.Join(changedDir, "model-*.safetensors"))
	slices.Sort(shards)
	last := shards[len(shards)-1]
	fi, err := os.Stat(last)
	if err != nil {
		return err
	}
	os.Remove(last) // a hard link to the original: write a new file, not through it
	if err := testmodel.WriteShard(last, fi.Size(), 9999); err != nil {
		return err
	}
	v2 := reg + "/bench/model:v2"
	if err := e.push(changedDir, v2); err != nil {
		return err
	}
	newBlobs, err := manifestOf(v2)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, d := range blobs.all() {
		have[d.Digest.String()] = true
	}
	var changed int64
	for _, d := range newBlobs.all() {
		if !have[d.Digest.String()] {
			changed += d.Size
		}
	}
	moved, err := cacheBench(root, v2, 1)
	if err != nil {
		return err
	}

	ms := func(s float64) string { return fmt.Sprintf("%.2f", s*1000) }
	fmt.Printf("cache (medians of %d interleaved rounds: curl %s / curl+sync %s / cold %s)\n", runs, bench.Runs(curlRuns), bench.Runs(curlsRuns), bench.Runs(coldRuns))
	fmt.Printf("%-44s %8.2f s vs parallel curl %6.2f s  %5sx  (target <= 1.25x)\n", "cold pull + view, "+e.size+" model:", tCold, tCurl, bench.Ratio(tCold, tCurl))
	fmt.Printf("%-44s %8.2f s vs curl + sync    %6.2f s  %5sx  (curl made durable before use)\n", "", tCold, tCurls, bench.Ratio(tCold, tCurls))
	fmt.Printf("%-44s %8s ms (10 MiB) vs %6s ms (%s)  %5sx  (target ~1x, both < 20 ms)\n", "warm view assembly, new model version:", ms(small.AssembleSeconds), ms(big.AssembleSeconds), e.size, bench.Ratio(big.AssembleSeconds, small.AssembleSeconds))
	fmt.Printf("%-44s %8s ms (10 MiB) vs %6s ms (%s)  %5sx  (target ~1x, both < 20 ms)\n", "warm view for a new volume (view shared):", ms(small.NewVolumeSeconds), ms(big.NewVolumeSeconds), e.size, bench.Ratio(big.NewVolumeSeconds, small.NewVolumeSeconds))
	fmt.Printf("%-44s %8s ms for %d files (%d files in the %s model)\n", "view assembly, 1,000-file model:", ms(many.AssembleSeconds), many.Files, cold.Files, e.size)
	fmt.Printf("%-44s %8d bytes for %d changed  %7.4fx  (target <= 1.01x)\n", "changed-shard pull, bytes transferred:", moved.BlobBytes, changed, float64(moved.BlobBytes)/float64(changed))
	return nil
}

// pulledModel generates a model into dir, pushes it to ref, pulls it into a fresh cache root and returns the view
// figures of a second, warm run of rounds assemblies.
func pulledModel(e *env, dir string, spec testmodel.Spec, ref, root string, rounds int) (cacheResult, error) {
	if err := testmodel.Generate(dir, spec); err != nil {
		return cacheResult{}, err
	}
	if err := e.push(dir, ref); err != nil {
		return cacheResult{}, err
	}
	if _, err := cacheBench(root, ref, 1); err != nil {
		return cacheResult{}, err
	}
	return cacheBench(root, ref, rounds)
}

// linkTree recreates src's files under dst as hard links (cp -al), leaving out the .complete mark.
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Name() == ".complete" {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		return os.Link(p, filepath.Join(dst, rel))
	})
}

// cacheResult is what cacheBench measures.
type cacheResult struct {
	PullSeconds      float64 // Pull alone
	ViewSeconds      float64 // the first Acquire: builds the view
	ColdSeconds      float64 // Pull + first Acquire
	BlobBytes        int64   // bytes of blob responses received
	Files            int     // files in the view
	AssembleSeconds  float64 // median time to assemble a fresh view of the whole model
	NewVolumeSeconds float64 // median Acquire of an existing view by a new volume
}

// cacheBench pulls ref (plain HTTP) into the node cache at root through the driver's transport, counting the blob
// bytes that cross the wire, builds its view, then times rounds fresh view assemblies and rounds acquisitions of
// an existing view by a new volume. It leaves the cache as a driver would after its volumes went away.
func cacheBench(root, ref string, rounds int) (cacheResult, error) {
	ctx := context.Background()
	var r cacheResult
	var blobBytes atomic.Int64
	repo, parsed, err := remote.NewRepository(ref, remote.Options{
		PlainHTTP:     true,
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, &blobBytes} },
	})
	if err != nil {
		return r, err
	}
	desc, err := repo.Resolve(ctx, parsed.Reference)
	if err != nil {
		return r, err
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return r, err
	}
	c, err := cache.Open(cache.Options{Root: root})
	if err != nil {
		return r, err
	}
	err = measureViews(c, repo, desc, rounds, &r)
	r.BlobBytes = blobBytes.Load()
	return r, errors.Join(err, c.Close())
}

// measureViews is cacheBench's work on the open cache.
func measureViews(c *cache.Cache, repo oras.ReadOnlyTarget, desc ocispec.Descriptor, rounds int, r *cacheResult) error {
	ctx := context.Background()
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
	if r.Files, err = countFiles(dir); err != nil {
		return err
	}
	// Fresh assemblies of the whole model: a selector that keeps everything but names a distinct view each round.
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
	r.AssembleSeconds, r.NewVolumeSeconds = bench.Median(assemble), bench.Median(acquire)
	refs, _ := c.Refs()
	for _, ref := range refs {
		c.Release(ref.Owner)
	}
	return nil
}

// countingTransport counts the bytes of blob response bodies.
type countingTransport struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (t countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err == nil && (resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusPartialContent) && strings.Contains(req.URL.Path, "/blobs/") {
		resp.Body = countingBody{resp.Body, t.n}
	}
	return resp, err
}

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
