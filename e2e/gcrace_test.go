package e2e

import (
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// GC never evicts what a publish is about to mount, under the harshest settings: a cache capped far below one
// model, no minimum age, a collection every second, and four kubelets publishing and unpublishing three models
// (each publish of a model finds it, holds it, mounts it; GC evicts it as soon as nothing does). Every publish
// mounts the right model: none fails NOT_FOUND for content GC took in between. The kubelets go on until GC has
// evicted several times while they publish (a fixed number of rounds can all finish before the first collection).
func TestDriverGCNeverEvictsWhatAPublishIsAboutToMount(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	var refs []string
	for i := range 3 {
		name := fmt.Sprint("m", i)
		testmodel.Push(t, reg.Host, "models/"+name, "v1", drvSmallModel(name), nil)
		refs = append(refs, reg.Host+"/models/"+name+":v1")
	}
	d := drvStartWith(t, filepath.Join(dir, "node"), []string{"--cache-max-size", "1KiB", "--cache-min-age", "0", "--gc-interval", "1s"}, reg.Host)
	node := d.node()
	const workers, minRounds, minEvictions, maxRounds = 4, 40, 3, 4000
	var wg sync.WaitGroup
	errs := make(chan error, workers*maxRounds)
	var published atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := 0; i < maxRounds && (i < minRounds || d.metric("modelpack_cache_gc_evictions_total") < minEvictions); i++ {
				published.Add(1)
				m := (w + i) % len(refs)
				vol := fmt.Sprintf("w%d-%d", w, i)
				target := drvKubelet(t, dir, "pod-"+vol)
				req := testenv.PublishRequest(vol, target, map[string]string{"reference": refs[m], "pullPolicy": "IfNotPresent"})
				if err := drvPublish(node, req, time.Minute); err != nil {
					errs <- fmt.Errorf("publish %s of %s: %w", vol, refs[m], err)
					continue
				}
				if got := drvRead(t, filepath.Join(target, "model.safetensors")); got != fmt.Sprint("weights of m", m) {
					errs <- fmt.Errorf("%s mounted %q", vol, got)
				}
				drvUnpublish(t, node, vol, target)
			}
		})
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		n++
		t.Error(err)
	}
	if evicted := d.metric("modelpack_cache_gc_evictions_total"); evicted < minEvictions {
		t.Fatalf("GC evicted %v times in %d publishes: the race was not exercised", evicted, published.Load())
	} else {
		t.Logf("%d publishes, %d failed, %v evictions", published.Load(), n, evicted)
	}
}
