package diskio

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// WillNeed asks for the windows not in the page cache, and only for those.
func TestWillNeedAsksOnlyForWhatIsNotCached(t *testing.T) {
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
	asked, err := WillNeed(f, 0, size)
	if err != nil || asked != size {
		t.Fatalf("out of the page cache: asked for %d bytes, %v; want all %d", asked, err, size)
	}
	testenv.WaitResident(t, p, drops, func() { WillNeed(f, 0, size) })

	if _, err := os.ReadFile(p); err != nil { // every page, for certain
		t.Fatal(err)
	}
	if asked, err := WillNeed(f, 0, size); err != nil || asked != 0 {
		t.Fatalf("in the page cache: asked for %d bytes, %v; want none", asked, err)
	}
}
