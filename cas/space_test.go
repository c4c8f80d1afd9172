package cas

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/internal/testenv"
)

// smallDisk mounts a tmpfs of size bytes at a fresh directory (unmounted at cleanup).
func smallDisk(t *testing.T, size string) string { return testenv.SmallDisk(t, size) }

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

func TestIngestLargerThanTheDiskFailsBeforeDownloading(t *testing.T) {
	s, err := Open(smallDisk(t, "4m"))
	if err != nil {
		t.Fatal(err)
	}
	before := freeBytes(t, s.Root())
	big := &source{blob: blob(8 << 20), seekable: true}
	err = s.Ingest(context.Background(), digest.FromBytes(big.blob), int64(len(big.blob)), big.open)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("ingest of 8 MiB into a 4 MiB disk: %v, want ENOSPC", err)
	}
	if n := big.opens.Load(); n != 0 {
		t.Fatalf("the source was opened %d times: the download started before the disk was known to be too small", n)
	}
	if p := partials(t, s); len(p) != 0 {
		t.Fatalf("partials left: %v", p)
	}
	if after := freeBytes(t, s.Root()); after != before {
		t.Fatalf("free space %d after the refused ingest, %d before: the reservation was not given back", after, before)
	}
	// A blob that fits still lands.
	small := &source{blob: blob(2 << 20), seekable: true}
	if err := s.Ingest(context.Background(), digest.FromBytes(small.blob), int64(len(small.blob)), small.open); err != nil {
		t.Fatal(err)
	}
}

func TestResumeThatNoLongerFitsKeepsItsPartial(t *testing.T) {
	s, err := Open(smallDisk(t, "4m"))
	if err != nil {
		t.Fatal(err)
	}
	src := &source{blob: blob(3 << 20), seekable: true}
	d := digest.FromBytes(src.blob)
	// A partial of 1 MiB from an earlier attempt, written without a reservation (as before preallocation).
	partial := filepath.Join(s.Root(), "ingest", "sha256-"+d.Encoded()+".partial")
	if err := os.WriteFile(partial, src.blob[:1<<20], 0o644); err != nil {
		t.Fatal(err)
	}
	// Something else took most of the rest of the disk.
	if err := os.WriteFile(filepath.Join(s.Root(), "other"), make([]byte, freeBytes(t, s.Root())-(512<<10)), 0o644); err != nil {
		t.Fatal(err)
	}
	before := freeBytes(t, s.Root())
	err = s.Ingest(context.Background(), d, int64(len(src.blob)), src.open)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("resume that does not fit: %v, want ENOSPC", err)
	}
	if n := src.opens.Load(); n != 0 {
		t.Fatalf("the source was opened %d times", n)
	}
	if p := partials(t, s); p[d] != 1<<20 {
		t.Fatalf("partials %v: the resumable 1 MiB should be kept", p)
	}
	if after := freeBytes(t, s.Root()); after != before {
		t.Fatalf("free space %d after the refused resume, %d before", after, before)
	}
	// With room again, the ingest resumes from the kept bytes.
	if err := os.Remove(filepath.Join(s.Root(), "other")); err != nil {
		t.Fatal(err)
	}
	if err := s.Ingest(context.Background(), d, int64(len(src.blob)), src.open); err != nil {
		t.Fatal(err)
	}
	if got := src.served.Load(); got != 2<<20 {
		t.Fatalf("the source served %d bytes, want the missing 2 MiB", got)
	}
}
