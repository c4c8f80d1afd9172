package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// statPercent is how full the file system at dir is, as df and kubelet round it.
func statPercent(t *testing.T, dir string) int {
	t.Helper()
	var s syscall.Statfs_t
	if err := syscall.Statfs(dir, &s); err != nil {
		t.Fatal(err)
	}
	return 100 - int(s.Bavail*100/s.Blocks)
}

// waitGCRuns waits until the driver has finished n more collections than it had at the call: every collection
// counted after the call began after it, so it saw the state the test set up.
func (p *drvProc) waitGCRuns(n float64) {
	p.t.Helper()
	start := p.metric("modelpack_cache_gc_runs_total")
	deadline := time.Now().Add(time.Minute)
	for p.metric("modelpack_cache_gc_runs_total") < start+n {
		if time.Now().After(deadline) {
			p.t.Fatalf("the driver ran no collection in a minute (%v runs)", start)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The driver's disk watermarks, on a real 16 MiB cache file system: under --cache-high-watermark its collections
// evict nothing; once a third model brings the disk over it, they evict the unused models down to
// --cache-low-watermark and keep the mounted one.
func TestDriverCacheDiskWatermarks(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	var refs []string
	for i := range 3 {
		name := fmt.Sprint("m", i)
		testmodel.Push(t, reg.Host, "models/"+name, "v1", drvModel{"model.safetensors": randomBytes(t, 4<<20)}, nil)
		refs = append(refs, reg.Host+"/models/"+name+":v1")
	}
	root := drvSmallDisk(t, dir, "16m")
	d := drvStartWith(t, root, []string{"--cache-high-watermark", "60", "--cache-low-watermark", "35", "--cache-min-age", "0",
		"--gc-interval", "50ms", "--log-level", "info"}, reg.Host)
	node := d.node()
	for i, ref := range refs[:2] {
		vol := fmt.Sprint("v", i)
		target := drvKubelet(t, dir, "pod-"+vol)
		if err := drvPublish(node, testenv.PublishRequest(vol, target, map[string]string{"reference": ref}), time.Minute); err != nil {
			t.Fatal(err)
		}
		drvUnpublish(t, node, vol, target)
	}
	d.waitGCRuns(2)
	if p := statPercent(t, root); p >= 60 {
		t.Fatalf("setup: two models fill %d%% of the disk, over the high watermark", p)
	}
	if n := d.metric("modelpack_cache_gc_evictions_total"); n != 0 {
		t.Fatalf("under the high watermark (%d%% used) the driver evicted %v models", statPercent(t, root), n)
	}
	target := drvKubelet(t, dir, "pod-v2")
	if err := drvPublish(node, testenv.PublishRequest("v2", target, map[string]string{"reference": refs[2]}), time.Minute); err != nil {
		t.Fatal(err)
	}
	d.waitGCRuns(2)
	if n := d.metric("modelpack_cache_gc_evictions_total"); n != 2 {
		t.Fatalf("over the high watermark the driver evicted %v models, want the 2 unused ones", n)
	}
	p := statPercent(t, root)
	if p > 35 {
		t.Fatalf("after the collection the disk is %d%% used, over the low watermark 35", p)
	}
	if got := d.metric("modelpack_cache_disk_used_percent"); got != float64(p) {
		t.Errorf("modelpack_cache_disk_used_percent %v, statfs says %d", got, p)
	}
	if len(drvRead(t, filepath.Join(target, "model.safetensors"))) != 4<<20 {
		t.Fatal("the mounted model lost its weights")
	}
	drvUnpublish(t, node, "v2", target)
	d.stop()
}

// Watermarks out of range stop the driver at start with a usage error naming the flag and the valid range.
func TestDriverRefusesBadWatermarks(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cache-high-watermark", "101", "--cache-low-watermark", "80"}, "--cache-high-watermark 101: want a percent of the cache's file system from 1 to 100"},
		{[]string{"--cache-high-watermark", "80", "--cache-low-watermark", "85"}, "--cache-low-watermark 85: want a percent from 0 to below --cache-high-watermark (80)"},
		{[]string{"--cache-low-watermark", "50"}, "--cache-high-watermark 0"},
	} {
		cmd := exec.Command(testenv.Modelpack(t), append([]string{"csi-driver", "--root", t.TempDir(), "--endpoint", "unix://" + filepath.Join(t.TempDir(), "s.sock")}, tc.args...)...)
		b, _ := cmd.CombinedOutput()
		out, code := string(b), cmd.ProcessState.ExitCode()
		if code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("%v: exit %d, want 2 with %q:\n%s", tc.args, code, tc.want, out)
		}
	}
}
