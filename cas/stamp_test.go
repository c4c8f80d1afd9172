package cas

import (
	"bytes"
	"context"
	"errors"
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
