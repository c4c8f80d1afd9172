package beneath

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// tree makes dir/{file, sub/file, link → file, out → /etc/hostname-like outside file, sublink → sub, fifo}.
func tree(t *testing.T) (string, string) {
	t.Helper()
	base := t.TempDir()
	dir := filepath.Join(base, "model")
	outside := filepath.Join(base, "outside")
	must(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
	must(t, os.WriteFile(outside, []byte("SECRET"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "file"), []byte("inside"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "sub", "file"), []byte("nested"), 0o644))
	must(t, os.Symlink("file", filepath.Join(dir, "link")))
	must(t, os.Symlink(outside, filepath.Join(dir, "out")))
	must(t, os.Symlink("sub", filepath.Join(dir, "sublink")))
	must(t, syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	return dir, outside
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Both resolutions (openat2, and O_NOFOLLOW per component as on kernels without it) refuse every link, at the end
// of a path or on the way, open regular files only, and never block on a fifo.
func TestOpen(t *testing.T) {
	for _, fallback := range []bool{false, true} {
		t.Run(map[bool]string{false: "openat2", true: "per-component"}[fallback], func(t *testing.T) {
			noOpenat2 = fallback
			t.Cleanup(func() { noOpenat2 = false })
			dir, _ := tree(t)
			d, err := OpenDir(dir)
			must(t, err)
			defer d.Close()
			for rel, want := range map[string]string{"file": "inside", "sub/file": "nested", "./sub//file": "nested"} {
				f, err := d.Open(rel)
				if err != nil {
					t.Fatalf("%s: %v", rel, err)
				}
				b, _ := io.ReadAll(f)
				if string(b) != want {
					t.Errorf("%s: read %q", rel, b)
				}
				must(t, f.Unchanged())
				f.Close()
			}
			for rel, want := range map[string]error{
				"link": ErrSymlink, "out": ErrSymlink, "sublink/file": ErrSymlink, "sublink": ErrSymlink,
				"../outside": ErrNotLocal, "/etc/passwd": ErrNotLocal, "sub": ErrNotRegular, "fifo": ErrNotRegular,
			} {
				done := make(chan error, 1)
				go func() {
					f, err := d.Open(rel)
					if err == nil {
						f.Close()
					}
					done <- err
				}()
				select {
				case err := <-done:
					if !errors.Is(err, want) {
						t.Errorf("%s: got %v, want %v", rel, err, want)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("%s: open blocked", rel)
				}
			}
			if _, err := d.Sub("sublink"); !errors.Is(err, ErrSymlink) {
				t.Errorf("Sub through a link: %v", err)
			}
		})
	}
}

// A device node is refused before a byte of it is read.
func TestOpenDevice(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mknod(filepath.Join(dir, "null"), syscall.S_IFCHR|0o644, 1<<8|3); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mknod: %v", err)
		}
		t.Skipf("mknod needs root: %v", err)
	}
	d, err := OpenDir(dir)
	must(t, err)
	defer d.Close()
	if _, err := d.Open("null"); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("device: %v", err)
	}
}

// Unchanged refuses a file written to while it was read; Same a file replaced since it was listed.
func TestChanged(t *testing.T) {
	dir, _ := tree(t)
	d, err := OpenDir(dir)
	must(t, err)
	defer d.Close()
	listed, err := d.Lstat("file")
	must(t, err)
	f, err := d.Open("file")
	must(t, err)
	must(t, f.Same(listed))
	must(t, os.WriteFile(filepath.Join(dir, "file"), []byte("inside, and more"), 0o644))
	if err := f.Unchanged(); !errors.Is(err, ErrChanged) {
		t.Fatalf("grown file: %v", err)
	}
	f.Close()
	must(t, os.Rename(filepath.Join(dir, "sub", "file"), filepath.Join(dir, "file")))
	g, err := d.Open("file")
	must(t, err)
	defer g.Close()
	if err := g.Same(listed); !errors.Is(err, ErrChanged) {
		t.Fatalf("replaced file: %v", err)
	}
}

// Walk lists entries in WalkDir's order without entering linked directories, and SkipDir skips.
func TestWalk(t *testing.T) {
	dir, _ := tree(t)
	must(t, os.MkdirAll(filepath.Join(dir, "skip", "deep"), 0o755))
	d, err := OpenDir(dir)
	must(t, err)
	defer d.Close()
	var got []string
	must(t, d.Walk("", func(e Entry) error {
		got = append(got, e.Rel+":"+e.Stat.Mode.Type().String())
		if e.Rel == "skip" {
			return SkipDir
		}
		return nil
	}))
	want := []string{"fifo:p---------", "file:----------", "link:L---------", "out:L---------", "skip:d---------", "sub:d---------", "sub/file:----------", "sublink:L---------"}
	if len(got) != len(want) {
		t.Fatalf("walk: %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("walk: %v, want %v", got, want)
		}
	}
	target, err := d.Readlink("sublink")
	must(t, err)
	if target != "sub" {
		t.Fatalf("readlink: %q", target)
	}
}

// The seam between a check and a use: a file listed as regular and swapped for a link to an outside file right
// before it is opened is refused, in both resolutions; so is a parent directory swapped for a link.
func TestSwapBeforeOpen(t *testing.T) {
	for _, fallback := range []bool{false, true} {
		for _, swapped := range []string{"file", "sub"} {
			t.Run(fmt.Sprint(swapped, fallback), func(t *testing.T) {
				noOpenat2 = fallback
				dir, outside := tree(t)
				os.MkdirAll(filepath.Join(filepath.Dir(outside), "odir"), 0o755)
				os.WriteFile(filepath.Join(filepath.Dir(outside), "odir", "file"), []byte("SECRET"), 0o644)
				target := outside
				if swapped == "sub" {
					target = filepath.Join(filepath.Dir(outside), "odir")
				}
				openHook = func(string) {
					must(t, os.Symlink(target, filepath.Join(dir, ".swap")))
					must(t, os.Rename(filepath.Join(dir, ".swap"), filepath.Join(dir, swapped)))
				}
				t.Cleanup(func() { openHook, noOpenat2 = nil, false })
				d, err := OpenDir(dir)
				must(t, err)
				defer d.Close()
				rel := "file"
				if swapped == "sub" {
					os.RemoveAll(filepath.Join(dir, "sub"))
					rel = "sub/file"
				}
				if _, err := d.Lstat(rel); err != nil && swapped == "file" {
					t.Fatal(err)
				}
				f, err := d.Open(rel)
				if err == nil {
					b, _ := io.ReadAll(f)
					f.Close()
					t.Fatalf("opened through the swapped link: %q", b)
				}
				if !errors.Is(err, ErrSymlink) {
					t.Fatalf("got %v, want ErrSymlink", err)
				}
			})
		}
	}
}
