package readahead

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/modelpack/modelpack/internal/testenv"
)

// hookWaiting calls f each time a readahead waits for its first open, until the test ends.
func hookWaiting(t *testing.T, f func(dir string)) {
	waitingHook = f
	t.Cleanup(func() { waitingHook = nil })
}

// A readahead told to wait reads nothing meanwhile, and nothing at all once the pod opens a file of the volume,
// through its own bind mount of it as a pod's container does: the pod reads its model itself.
func TestReadaheadLeavesAReadingPodAlone(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	view := filepath.Join(dir, "view")
	writeFile(t, view, "config.json", 300)
	weights := writeFile(t, view, "weights/model.safetensors", 8<<20)
	pod := filepath.Join(dir, "pod")
	if err := os.Mkdir(pod, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(view, pod, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	unmount := func() { unix.Unmount(pod, unix.MNT_DETACH) }
	t.Cleanup(unmount)

	var res Result
	r := New(context.Background(), Options{Budget: Fixed(1 << 30), WaitForOpen: 10 * time.Minute, Done: func(got Result) { res = got }})
	hookWaiting(t, func(string) {
		wantNotResident(t, weights) // waiting, it has read nothing
		f, err := os.Open(filepath.Join(pod, "config.json"))
		if err != nil {
			t.Error(err)
			return
		}
		f.Close()
	})
	if !r.Start(view) {
		t.Fatal("Start refused the first readahead of a directory")
	}
	r.Wait()
	if !res.Opened || res.WaitErr != nil || res.Err != nil || res.Files != 0 || res.Bytes != 0 {
		t.Fatalf("result %+v: want the wait ended by the open, and nothing read", res)
	}
	wantNotResident(t, weights)
	unmount()
	testenv.NoMountsLeftUnder(t, dir)
}

// With no open, the readahead starts once WaitForOpen has passed; stopped while it waits, it reads nothing.
func TestReadaheadWaitsNoLongerThanTold(t *testing.T) {
	view := t.TempDir()
	weights := writeFile(t, view, "model.safetensors", 4<<20)
	drops := testenv.PageCacheDrops(t)
	var res Result
	r := New(context.Background(), Options{Budget: Fixed(1 << 30), WaitForOpen: 50 * time.Millisecond, Done: func(got Result) { res = got }})
	r.Start(view)
	r.Wait()
	if res.Opened || res.Waited < 50*time.Millisecond || res.Err != nil || res.Files != 1 {
		t.Fatalf("result %+v: want a wait of 50ms with no open, then the file read", res)
	}
	testenv.WaitResident(t, weights, drops, func() { runOnce(t, view, Fixed(1<<30)) })

	testenv.EvictPages(t, weights)
	r = New(context.Background(), Options{Budget: Fixed(1 << 30), WaitForOpen: 10 * time.Minute, Done: func(got Result) { res = got }})
	hookWaiting(t, func(dir string) { r.Stop(dir) })
	r.Start(view)
	r.Wait()
	if res.Opened || !errors.Is(res.Err, context.Canceled) || res.Bytes != 0 {
		t.Fatalf("stopped while waiting: %+v; want nothing read and the stop reported", res)
	}
	wantNotResident(t, weights)
}
