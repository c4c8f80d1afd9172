package readahead

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// writeFile writes size bytes to dir/name and drops its pages from the page cache.
func writeFile(t testing.TB, dir, name string, size int) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i * 7)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.EvictPages(t, p)
	return p
}

func wantNotResident(t *testing.T, path string) {
	t.Helper()
	if n, total := testenv.ResidentPages(t, path); n != 0 {
		t.Fatalf("%s: %d of %d pages resident, want none read", path, n, total)
	}
}

// runOnce reads dir with budget and returns the result.
func runOnce(t testing.TB, dir string, budget Budget) Result {
	t.Helper()
	var res Result
	r := New(context.Background(), Options{Budget: budget, Done: func(got Result) { res = got }})
	if !r.Start(dir) {
		t.Fatal("Start refused the first readahead of a directory")
	}
	r.Wait()
	return res
}

func TestReadaheadFillsThePageCache(t *testing.T) {
	dir := t.TempDir()
	view := filepath.Join(dir, "view")
	small := writeFile(t, view, "config.json", 300)
	// Larger than a chunk and than any device's readahead window: one fadvise for it all would read its start only.
	big := writeFile(t, view, "weights/model.safetensors", 40<<20)
	outside := writeFile(t, dir, "outside.bin", 1<<20)
	if err := os.Symlink(outside, filepath.Join(view, "link.bin")); err != nil {
		t.Fatal(err)
	}

	drops := testenv.PageCacheDrops(t)
	res := runOnce(t, view, Fixed(1<<30))
	if res.Err != nil || res.Files != 2 || res.Bytes != 300+40<<20 || res.Uncached != res.Bytes || res.Skipped != 0 {
		t.Fatalf("result %+v, want 2 files of %d bytes, all uncached, none skipped, no error", res, 300+40<<20)
	}
	redo := func() { runOnce(t, view, Fixed(1<<30)) }
	testenv.WaitResident(t, small, drops, redo)
	testenv.WaitResident(t, big, drops, redo)
	wantNotResident(t, outside) // the link out of the view was not followed
}

func TestReadaheadKeepsToTheBudget(t *testing.T) {
	view := t.TempDir()
	a := writeFile(t, view, "a", 1<<20)
	b := writeFile(t, view, "b", 4<<20)
	c := writeFile(t, view, "c", 16<<20)

	drops := testenv.PageCacheDrops(t)
	res := runOnce(t, view, Fixed(6<<20))
	if res.Files != 2 || res.Bytes != 5<<20 || res.Skipped != 1 || res.SkippedBytes != 16<<20 || res.Budget != 6<<20 {
		t.Fatalf("result %+v, want a and b read (5 MiB), c skipped", res)
	}
	redo := func() { runOnce(t, view, Fixed(6<<20)) }
	testenv.WaitResident(t, a, drops, redo)
	testenv.WaitResident(t, b, drops, redo)
	wantNotResident(t, c)

	if res := runOnce(t, view, Fixed(0)); res.Files != 0 || res.Skipped != 3 {
		t.Fatalf("zero budget: %+v, want nothing read", res)
	}
	wantNotResident(t, c)
}

// Replicas publishing one view at once start one readahead; the next publish after it ended starts another.
func TestOneReadaheadPerDirectory(t *testing.T) {
	dir1, dir2 := t.TempDir(), t.TempDir()
	writeFile(t, dir1, "w", 1<<20)
	var mu sync.Mutex
	var results []Result
	started, release := make(chan string, 4), make(chan struct{})
	r := New(context.Background(), Options{
		Budget: Fixed(1 << 30),
		Done: func(res Result) {
			mu.Lock()
			results = append(results, res)
			mu.Unlock()
		},
		Gate: func(dir string) {
			started <- dir
			<-release
		},
	})
	if !r.Start(dir1) {
		t.Fatal("first Start refused")
	}
	<-started
	var wg sync.WaitGroup
	var again [8]bool
	for i := range again {
		wg.Go(func() { again[i] = r.Start(dir1 + "/") })
	}
	wg.Wait()
	for i, ok := range again {
		if ok {
			t.Fatalf("publish %d started a second readahead of a directory being read", i)
		}
	}
	if !r.Start(dir2) {
		t.Fatal("another directory was refused")
	}
	<-started
	close(release)
	r.Wait()
	if len(results) != 2 {
		t.Fatalf("%d readaheads ran, want 2", len(results))
	}
	if !r.Start(dir1) {
		t.Fatal("a directory whose readahead ended cannot be read again")
	}
	<-started
	r.Wait()
}

// Stop and the end of the driver's context stop a readahead before it reads any more.
func TestReadaheadStops(t *testing.T) {
	for _, how := range []string{"stop", "shutdown"} {
		t.Run(how, func(t *testing.T) {
			view := t.TempDir()
			w := writeFile(t, view, "w", 8<<20)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var res Result
			started, release := make(chan struct{}), make(chan struct{})
			r := New(ctx, Options{
				Budget: Fixed(1 << 30),
				Done:   func(got Result) { res = got },
				Gate: func(string) {
					close(started)
					<-release
				},
			})
			r.Start(view)
			<-started
			if how == "stop" {
				r.Stop(view)
			} else {
				cancel()
			}
			close(release)
			r.Wait()
			if !errors.Is(res.Err, context.Canceled) || res.Files != 0 || res.Bytes != 0 {
				t.Fatalf("result %+v, want context.Canceled and nothing read", res)
			}
			wantNotResident(t, w)
			if how == "shutdown" && r.Start(view) {
				t.Fatal("a readahead started after shutdown")
			}
		})
	}
}

func TestAutoBudget(t *testing.T) {
	meminfo, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	avail := memAvailable(string(meminfo))
	// MemAvailable moves between the two reads; three quarters still tells half of it from all of it.
	if got := Auto(); got <= 0 || got > avail*3/4 {
		t.Fatalf("Auto() = %d, want above 0 and about half of MemAvailable (%d) at most", got, avail)
	}
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"MemTotal:       24684000 kB\nMemAvailable:   2048 kB\n", 2 << 20},
		{"MemTotal: 1 kB\n", 0},
		{"MemAvailable: lots kB\n", 0},
		{"MemAvailable: 12 MB\n", 0},
		{"MemAvailable: -5 kB\n", 0},
	} {
		if got := memAvailable(tc.in); got != tc.want {
			t.Errorf("memAvailable(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// The cgroup limit is read from the hierarchy the process is in, v2 or v1, at its own level or an ancestor's,
// with "no limit" values ignored.
func TestCgroupLimit(t *testing.T) {
	dir := t.TempDir()
	put := func(rel, content string) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("v2/kubepods/memory.max", "max")
	put("v2/kubepods/pod1/memory.max", "1073741824")
	put("v2/kubepods/pod2/memory.max", "max")
	put("v1 mem/kubepods/memory.limit_in_bytes", "2147483648")
	put("v1 mem/kubepods/c1/memory.limit_in_bytes", "9223372036854771712")
	put("ns/memory.max", "536870912")
	v2 := "30 25 0:26 / " + dir + "/v2 rw,nosuid - cgroup2 cgroup2 rw\n"
	v1 := "14 34 0:31 / " + dir + `/v1\040mem rw,relatime - cgroup cgroup rw,memory` + "\n" +
		"15 34 0:32 / " + dir + "/v2 rw - cgroup cgroup rw,cpu\n"
	ns := "40 25 0:26 /kubepods/pod3 " + dir + "/ns rw - cgroup2 cgroup2 rw\n"
	for _, tc := range []struct {
		name, cgroup, mounts string
		want                 int64
	}{
		{"v2 own limit", "0::/kubepods/pod1\n", v2, 1 << 30},
		{"v2 no limit", "0::/kubepods/pod2\n", v2, 0},
		{"v1 parent's limit, own is none", "4:memory:/kubepods/c1\n1:cpu:/kubepods/c1\n", v1, 2 << 30},
		{"v1 not mounted", "4:memory:/kubepods/c1\n", v2, 0},
		{"cgroup namespace: mount root is the cgroup", "0::/kubepods/pod3\n", ns, 512 << 20},
		{"path outside the mount's root", "0::/other\n", ns, 0},
		{"garbage", "nonsense\n", "nonsense\n", 0},
	} {
		if got := cgroupLimit(tc.cgroup, tc.mounts); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
