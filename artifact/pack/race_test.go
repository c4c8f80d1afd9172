package pack_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/pack"
)

// secret is what files outside the model hold; inside files have the same sizes and other bytes, so only
// following a link (not a size check) could bring the secret into an artifact.
var (
	secret = bytes.Repeat([]byte("OUTSIDE-SECRET!"), 700)
	inside = bytes.Repeat([]byte("inside-weights."), 700)
)

// swapCase lays out a model whose entry a and entry b a racing goroutine exchanges with rename(2)
// (RENAME_EXCHANGE), one of them being or leading to a file outside the model.
type swapCase struct {
	setup func(t *testing.T, base string) (dir, a, b string)
}

func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// hubLayout makes CACHE/models--acme--race/{blobs/<etag>, snapshots/<commit>/{model.safetensors,sub/notes.md}
// → ../../blobs/…} and returns the repository's cache dir and the snapshot.
func hubLayout(t *testing.T, base string) (repo, snap string) {
	repo = filepath.Join(base, "hub", "models--acme--race")
	snap = filepath.Join(repo, "snapshots", strings.Repeat("cd", 20))
	writeFile(t, filepath.Join(repo, "blobs", "e1"), inside)
	writeFile(t, filepath.Join(repo, "blobs", "e2"), inside)
	os.MkdirAll(filepath.Join(snap, "sub"), 0o755)
	symlink(t, "../../blobs/e1", filepath.Join(snap, "model.safetensors"))
	symlink(t, "../../../blobs/e2", filepath.Join(snap, "sub", "notes.md"))
	return repo, snap
}

var swapCases = map[string]swapCase{
	// The case: the weight file and a link to a file outside swap places.
	"file and outside link": {func(t *testing.T, base string) (string, string, string) {
		dir := filepath.Join(base, "model")
		writeFile(t, filepath.Join(dir, "model.safetensors"), inside)
		writeFile(t, filepath.Join(dir, "sub", "notes.md"), inside)
		writeFile(t, filepath.Join(base, "outside"), secret)
		symlink(t, filepath.Join(base, "outside"), filepath.Join(dir, ".swap"))
		return dir, filepath.Join(dir, "model.safetensors"), filepath.Join(dir, ".swap")
	}},
	// A parent directory and a link to a directory outside holding the same names.
	"parent directory and outside link": {func(t *testing.T, base string) (string, string, string) {
		dir := filepath.Join(base, "model")
		writeFile(t, filepath.Join(dir, "config.json"), []byte(`{"model_type":"inside"}`))
		writeFile(t, filepath.Join(dir, "sub", "model.safetensors"), inside)
		writeFile(t, filepath.Join(dir, "sub", "notes.md"), inside)
		writeFile(t, filepath.Join(base, "outside", "model.safetensors"), secret)
		writeFile(t, filepath.Join(base, "outside", "notes.md"), secret)
		symlink(t, filepath.Join(base, "outside"), filepath.Join(dir, ".swap"))
		return dir, filepath.Join(dir, "sub"), filepath.Join(dir, ".swap")
	}},
	// A Hub cache snapshot's link into blobs/ and a link out of the cache.
	"hub snapshot link": {func(t *testing.T, base string) (string, string, string) {
		_, snap := hubLayout(t, base)
		writeFile(t, filepath.Join(base, "outside"), secret)
		symlink(t, filepath.Join(base, "outside"), filepath.Join(snap, ".swap"))
		return snap, filepath.Join(snap, "model.safetensors"), filepath.Join(snap, ".swap")
	}},
	// The Hub cache's blobs/ and a link to a directory outside holding the same blob names.
	"hub blobs directory": {func(t *testing.T, base string) (string, string, string) {
		repo, snap := hubLayout(t, base)
		writeFile(t, filepath.Join(base, "outside", "e1"), secret)
		writeFile(t, filepath.Join(base, "outside", "e2"), secret)
		symlink(t, filepath.Join(base, "outside"), filepath.Join(repo, ".swap"))
		return snap, filepath.Join(repo, "blobs"), filepath.Join(repo, ".swap")
	}},
	// A fifo no one writes to: opening it for reading would block forever.
	"file and fifo": {func(t *testing.T, base string) (string, string, string) {
		dir := filepath.Join(base, "model")
		writeFile(t, filepath.Join(dir, "model.safetensors"), inside)
		writeFile(t, filepath.Join(dir, "sub", "notes.md"), inside)
		if err := syscall.Mkfifo(filepath.Join(dir, ".swap"), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir, filepath.Join(dir, "sub", "notes.md"), filepath.Join(dir, ".swap")
	}},
	// /dev/zero's device (as root; a link to the real one otherwise): reading it never ends.
	"file and device": {func(t *testing.T, base string) (string, string, string) {
		dir := filepath.Join(base, "model")
		writeFile(t, filepath.Join(dir, "model.safetensors"), inside)
		if err := syscall.Mknod(filepath.Join(dir, ".swap"), syscall.S_IFCHR|0o644, 1<<8|5); err != nil {
			symlink(t, "/dev/zero", filepath.Join(dir, ".swap"))
		}
		return dir, filepath.Join(dir, "model.safetensors"), filepath.Join(dir, ".swap")
	}},
}

// clearRefusals are the reasons a pack racing a swap may give; each comes after the path it concerns.
var clearRefusals = []string{
	"symlink points outside the model directory",
	"is a symbolic link, or lies under one",
	"file changed since it was listed",
	"file changed while it was read",
	"is a named pipe (fifo)",
	"is a character device",
	"symlink to a directory",
	"symlink through another symlink",
	"symlink to something that is",
}

// While a goroutine swaps a model's file, parent directory, Hub cache link or blobs/ directory with a link out
// of the model (or a fifo or device) by rename(2) in a loop, pack runs again and again: no blob the store ever
// receives holds the outside bytes, no pack blocks, and every pack either succeeds with the inside bytes or fails
// naming the path and one clear reason.
func TestPackRacingSwaps(t *testing.T) {
	runs := 150
	if testing.Short() {
		runs = 30
	}
	for name, c := range swapCases {
		for _, format := range []artifact.Format{artifact.FormatRaw, artifact.FormatTar} {
			t.Run(name+"/"+string(format), func(t *testing.T) {
				base := t.TempDir()
				dir, a, b := c.setup(t, base)
				s := openStore(t)
				// Unswapped, the model packs.
				if _, err := pack.Pack(context.Background(), dir, pack.Options{Tag: "race/m:ok", LayerFormat: format}, s.Sink()); err != nil {
					t.Fatalf("before any swap: %v", err)
				}
				stop := make(chan struct{})
				var swaps atomic.Int64
				var wg sync.WaitGroup
				var stopOnce sync.Once
				halt := func() { stopOnce.Do(func() { close(stop) }); wg.Wait() }
				t.Cleanup(halt) // a failed pack (t.Fatal) stops the swapper too
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
							t.Errorf("rename exchange: %v", err)
							return
						}
						swaps.Add(1)
						runtime.Gosched()
					}
				}()
				ok, refused := 0, map[string]int{}
				for i := range runs {
					err := packWithin(t, dir, pack.Options{Tag: fmt.Sprintf("race/m:%d", i), LayerFormat: format}, s.Sink())
					if err == nil {
						ok++
						continue
					}
					reason := ""
					for _, r := range clearRefusals {
						if strings.Contains(err.Error(), r) {
							reason = r
						}
					}
					if reason == "" || !strings.Contains(err.Error(), base) {
						t.Errorf("pack %d: unclear refusal: %v", i, err)
					}
					refused[reason]++
				}
				halt()
				t.Logf("%d swaps; %d packs OK, refused: %v", swaps.Load(), ok, refused)
				if leaked := storeHolds(t, s.Root(), secret[:64]); len(leaked) > 0 {
					t.Fatalf("the store holds the outside bytes in %v", leaked)
				}
			})
		}
	}
}

// packWithin packs, failing the test if the pack does not return within a minute (a fifo opened for reading).
func packWithin(t *testing.T, dir string, opts pack.Options, sink pack.Sink) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := pack.Pack(context.Background(), dir, opts, sink)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("pack of %s blocked", dir)
		return nil
	}
}

// storeHolds lists the files under root holding marker (blobs, and anything half-written).
func storeHolds(t *testing.T, root string, marker []byte) []string {
	t.Helper()
	var hits []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.Contains(b, marker) {
			hits = append(hits, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hits
}

// swapSink swaps two entries of the model right before the pack opens a layer: between the walk that listed a
// file and the read of it, deterministically.
type swapSink struct {
	pack.Sink
	a, b string
	once sync.Once
}

func (s *swapSink) AddBlob(ctx context.Context, desc ocispec.Descriptor, open func() (io.ReadCloser, error)) (ocispec.Descriptor, error) {
	if desc.MediaType != artifact.MediaTypeModelConfig {
		s.once.Do(func() {
			if err := unix.Renameat2(unix.AT_FDCWD, s.a, unix.AT_FDCWD, s.b, unix.RENAME_EXCHANGE); err != nil {
				panic(err)
			}
		})
	}
	return s.Sink.AddBlob(ctx, desc, open)
}

// Each swap, made once between the walk and the read, is refused with its reason, and nothing of the outside
// file is stored.
func TestPackSwapAfterWalk(t *testing.T) {
	want := map[string]string{
		"file and outside link":             "is a symbolic link, or lies under one",
		"parent directory and outside link": "is a symbolic link, or lies under one",
		"hub snapshot link":                 "", // the blob the walk resolved the link to is read: inside bytes
		"hub blobs directory":               "is a symbolic link, or lies under one",
		"file and fifo":                     "is a named pipe (fifo)",
		"file and device":                   "is a character device",
	}
	for name, c := range swapCases {
		for _, format := range []artifact.Format{artifact.FormatRaw, artifact.FormatTar} {
			t.Run(name+"/"+string(format), func(t *testing.T) {
				base := t.TempDir()
				dir, a, b := c.setup(t, base)
				s := openStore(t)
				_, err := pack.Pack(context.Background(), dir, pack.Options{Tag: "swap/m:1", LayerFormat: format, Concurrency: 1}, &swapSink{Sink: s.Sink(), a: a, b: b})
				switch {
				case want[name] == "" && err != nil:
					t.Fatalf("refused a swap that changed nothing read: %v", err)
				case want[name] == "":
				case err == nil:
					t.Fatal("packed after the swap")
				case !strings.Contains(err.Error(), want[name]) || !strings.Contains(err.Error(), base):
					t.Errorf("got %v, want %q after the path", err, want[name])
				}
				if leaked := storeHolds(t, s.Root(), secret[:64]); len(leaked) > 0 {
					t.Fatalf("the store holds the outside bytes in %v", leaked)
				}
			})
		}
	}
}
