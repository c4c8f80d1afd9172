package diskio

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// ReadIntoCache brings a file out of the disk into the page cache, and reads nothing of one already there.
func TestReadIntoCacheReadsOnlyWhatIsNotCached(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	const size = 20<<20 + 123 // more than a window on most disks, and a partial last page
	if err := os.WriteFile(p, make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	testenv.EvictPages(t, p)
	drops := testenv.PageCacheDrops(t)
	if c := CachedBytes(f, 0, size); c != 0 {
		t.Fatalf("evicted, yet %d bytes in the page cache", c)
	}
	if err := ReadIntoCache(f, 0, size); err != nil {
		t.Fatal(err)
	}
	testenv.WaitResident(t, p, drops, func() { ReadIntoCache(f, 0, size) })
	if c := CachedBytes(f, 0, size); c != size {
		t.Fatalf("after ReadIntoCache, %d of %d bytes in the page cache", c, size)
	}

	// In the page cache, nothing is read: the process's read bytes (rchar, cached reads included) stay.
	if _, err := os.ReadFile(p); err != nil {
		t.Fatal(err)
	}
	before := readBytes(t)
	if err := ReadIntoCache(f, 0, size); err != nil {
		t.Fatal(err)
	}
	if n := readBytes(t) - before; n >= size/2 {
		t.Fatalf("ReadIntoCache read %d bytes of a file whose every page was in the page cache", n)
	}
}

// readBytes is the process's rchar: bytes its read calls returned, from the disk or the page cache.
func readBytes(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no rchar in /proc/self/io")
	return 0
}
