package e2e

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// GC never evicts what a publish is about to mount, under the harshest settings: a cache capped far below one
// model, no minimum age, a collection every second, and four kubelets publishing and unpublishing three models
// (each publish of a model finds it, holds it, mounts it; GC evicts it as soon as nothing does). Every publish
// mounts the right model: none fails NOT_FOUND for content GC took in between.
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
	const workers, rounds = 4, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
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
	if evicted := d.metric("modelpack_cache_gc_evictions_total"); evicted == 0 {
		t.Fatal("GC evicted nothing: the race was not exercised")
	} else {
		t.Logf("%d publishes, %d failed, %v evictions", workers*rounds, n, evicted)
	}
}
