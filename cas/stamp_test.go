package cas

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Check re-hashes a blob only when its stamp changed: a dd conv=notrunc flip with the mtime put back, in a store
// opened afresh, is caught; a hardlink made and removed through Link and Unlink is not mistaken for a write; a
// suspect blob is re-hashed once whatever its stamp.
func TestCheckRehashesWhenTheStampChanged(t *testing.T) {
	root := t.TempDir()
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("weights "), 64<<10)
	d, _, err := s.Write(context.Background(), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	rehashed := 0
	t.Cleanup(SetCheckHookForTesting(func(got digest.Digest, event string) {
		if got == d && event == "rehash" {
			mu.Lock()
			rehashed++
			mu.Unlock()
		}
	}))
	count := func() int { mu.Lock(); defer mu.Unlock(); return rehashed }
	link := filepath.Join(t.TempDir(), "view-file")
	if err := s.Link(d, link); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Unlink(link); !ok || err != nil {
		t.Fatalf("unlink of a blob's hardlink: %v %v", ok, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Check(d); err != nil || count() != 0 {
		t.Fatalf("check of an untouched blob: %v, %d re-hashes, want none", err, count())
	}
	if err := s.SuspectAll(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Check(d); err != nil || count() != 1 {
		t.Fatalf("check of a suspect blob: %v, %d re-hashes, want 1", err, count())
	}
	if _, err := s.Check(d); err != nil || count() != 1 || s.Suspects() != 0 {
		t.Fatalf("a second check re-hashed again (%v, %d re-hashes, %d suspects)", err, count(), s.Suspects())
	}
	testenv.FlipByte(t, s.Path(d), 12345, true)
	if _, err := s.Check(d); !errors.Is(err, ErrDigestMismatch) || count() != 2 {
		t.Fatalf("check of a flipped blob: %v after %d re-hashes, want a digest mismatch", err, count())
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(root, "ingest", "stamps", "sha256-"+d.Encoded())); err != nil {
		t.Fatalf("no stamp file: %v", err)
	}
}

// A stamp file is read back as written, and no content makes its parser panic or accept an inode 0.
func FuzzParseStamp(f *testing.F) {
	f.Add([]byte(Stamp{Dev: 2049, Ino: 131, Size: 4096, Mtime: 1700000000123456789, Ctime: 1700000000987654321}.String()))
	f.Add([]byte("1 2 3 4\n"))
	f.Add([]byte("-1 0 -5 x y\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, ok := parseStamp(b)
		if !ok {
			return
		}
		if st.Ino == 0 {
			t.Fatalf("accepted inode 0 from %q", b)
		}
		if back, ok := parseStamp([]byte(st.String())); !ok || back != st {
			t.Fatalf("%+v does not read back (%+v)", st, back)
		}
	})
}

// storeWithBlob is a store holding one blob of 1 MiB, and its digest.
func storeWithBlob(t *testing.T) (*Store, digest.Digest) {
	t.Helper()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	d, _, err := s.Write(context.Background(), bytes.NewReader(bytes.Repeat([]byte("weights "), 128<<10)))
	if err != nil {
		t.Fatal(err)
	}
	return s, d
}

// After an unclean start, views of a blob deleted while it is re-hashed (the store's own unlinks, each changing its
// ctime) are not taken for writes: the intact blob passes at the first read, whatever number of them happen.
func TestOwnUnlinksDuringARehashAreNoWrite(t *testing.T) {
	s, d := storeWithBlob(t)
	views := t.TempDir()
	var links []string
	for i := range 4 {
		p := filepath.Join(views, fmt.Sprint("view-", i))
		if err := s.Link(d, p); err != nil {
			t.Fatal(err)
		}
		links = append(links, p)
	}
	if err := s.SuspectAll(); err != nil {
		t.Fatal(err)
	}
	passes := 0
	t.Cleanup(SetCheckHookForTesting(func(got digest.Digest, event string) {
		if got != d || event != "hashed" {
			return
		}
		// Every pass of the re-hash sees an unpublish delete a view (and so change the blob's ctime) during its read.
		if passes < len(links) {
			if ok, err := s.Unlink(links[passes]); !ok || err != nil {
				t.Errorf("unlink of a view: %v %v", ok, err)
			}
		}
		passes++
	}))
	if _, err := s.Check(d); err != nil {
		t.Fatalf("intact blob refused: %v", err)
	}
	if passes != 1 {
		t.Errorf("%d passes of the re-hash, want 1: the store's own unlink was taken for a write", passes)
	}
	// And its stamp holds: the next use re-hashes nothing.
	if _, err := s.Check(d); err != nil || passes != 1 {
		t.Fatalf("check after the re-hash: %v, %d passes", err, passes)
	}
}

// A view linked while the scrub re-hashes the blob (its stamp intact) goes ahead at once, and the scrub, which saw
// the link change the ctime under its read, still passes the blob.
func TestLinkDuringTheScrub(t *testing.T) {
	s, d := storeWithBlob(t)
	reading := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	scrubbed := make(chan error, 1)
	go func() {
		scrubbed <- s.Scrub(d, func(n int, urgent <-chan struct{}) error {
			once.Do(func() { close(reading) })
			select {
			case <-release:
			case <-urgent:
			}
			return nil
		})
	}()
	<-reading
	if err := s.Link(d, filepath.Join(t.TempDir(), "view")); err != nil {
		t.Fatalf("link while the scrub reads: %v", err)
	}
	close(release)
	if err := <-scrubbed; err != nil {
		t.Fatalf("scrub of an intact blob linked during it: %v", err)
	}
}

// A Link of a suspect blob waits for the re-hash under way (one read for both) and then links.
func TestLinkWaitsForTheRehash(t *testing.T) {
	s, d := storeWithBlob(t)
	if err := s.SuspectAll(); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	waiting := make(chan struct{}, 4)
	var mu sync.Mutex
	rehashes := 0
	t.Cleanup(SetCheckHookForTesting(func(got digest.Digest, event string) {
		if got != d {
			return
		}
		switch event {
		case "rehash":
			mu.Lock()
			rehashes++
			mu.Unlock()
			<-gate
		case "wait":
			waiting <- struct{}{}
		}
	}))
	checked := make(chan error, 1)
	go func() { _, err := s.Check(d); checked <- err }()
	linked := make(chan error, 1)
	go func() {
		// The Check above leads the re-hash or this Link does; whichever comes second waits.
		linked <- s.Link(d, filepath.Join(t.TempDir(), "view"))
	}()
	<-waiting
	close(gate)
	if err := <-checked; err != nil {
		t.Fatal(err)
	}
	if err := <-linked; err != nil {
		t.Fatalf("link of a suspect blob: %v", err)
	}
	if rehashes != 1 {
		t.Errorf("%d re-hashes, want 1 shared", rehashes)
	}
}
