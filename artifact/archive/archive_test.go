package archive

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/internal/testenv"
)

// entry is one tar entry for a generated test archive.
type entry struct {
	name, link string
	typ        byte
	mode       int64
	body       string
	size       int64 // declared size when it must differ from len(body)
}

func file(name, body string) entry {
	return entry{name: name, typ: tar.TypeReg, mode: 0o644, body: body}
}
func dir(name string) entry { return entry{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, target string) entry {
	return entry{name: name, typ: tar.TypeSymlink, link: target, mode: 0o777}
}
func hardlink(name, target string) entry { return entry{name: name, typ: tar.TypeLink, link: target} }

func makeTar(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		size := int64(len(e.body))
		if e.typ != tar.TypeReg {
			size = 0
		}
		if e.size != 0 {
			size = e.size
		}
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Size: size, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Flush leaves a short body to be reported by the reader, not by the writer.
	tw.Flush()
	tw.Close()
	return buf.Bytes()
}

// tree lists dir as testenv.Tree does, a file's content as itself.
func tree(t testing.TB, dir string) []string {
	t.Helper()
	return testenv.Tree(t, dir, func(b []byte) string { return string(b) })
}

func TestExtractFormats(t *testing.T) {
	raw := makeTar(t, dir("a"), file("a/b.txt", "hello"), file("c", "x"), symlink("a/l", "b.txt"), hardlink("h", "a/b.txt"))
	var gz, zs bytes.Buffer
	gw := gzip.NewWriter(&gz)
	gw.Write(raw)
	gw.Close()
	zw, _ := zstd.NewWriter(&zs)
	zw.Write(raw)
	zw.Close()
	want := []string{"a dir 755", "a/b.txt file 644 hello", "a/l symlink b.txt", "c file 644 x", "h file 644 hello"}
	for f, b := range map[artifact.Format][]byte{artifact.FormatTar: raw, artifact.FormatTarGzip: gz.Bytes(), artifact.FormatTarZstd: zs.Bytes()} {
		t.Run(string(f), func(t *testing.T) {
			d := t.TempDir()
			st, err := Unpack(bytes.NewReader(b), f, d, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if st.Entries != 5 || st.Bytes != 6 {
				t.Errorf("stats = %+v, want 5 entries, 6 bytes", st)
			}
			if got := tree(t, d); strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("tree:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			a, _ := os.Stat(filepath.Join(d, "a/b.txt"))
			h, _ := os.Stat(filepath.Join(d, "h"))
			if !os.SameFile(a, h) {
				t.Error("hardlink is a copy")
			}
		})
	}
	if err := Extract(bytes.NewReader(raw), artifact.FormatRaw, t.TempDir(), Options{}); err == nil {
		t.Error("raw format extracted")
	}
}

func TestExtractReadOnlyAndSetuid(t *testing.T) {
	b := makeTar(t,
		entry{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "bin/suid", typ: tar.TypeReg, mode: 0o4755, body: "x"},
		entry{name: "bin/sgid", typ: tar.TypeReg, mode: 0o2755, body: "y"},
		entry{name: "ro/", typ: tar.TypeDir, mode: 0o555},
		file("ro/late", "written after its read-only parent"),
	)
	d := t.TempDir()
	if err := Extract(bytes.NewReader(b), artifact.FormatTar, d, Options{ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]fs.FileMode{"bin/suid": 0o555, "bin/sgid": 0o555, "bin": fs.ModeDir | 0o555, "ro/late": 0o444, "ro": fs.ModeDir | 0o555} {
		fi, err := os.Lstat(filepath.Join(d, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s mode %v, want %v", p, fi.Mode(), want)
		}
	}
}

func TestExtractWorldReadable(t *testing.T) {
	b := makeTar(t, entry{name: "private/", typ: tar.TypeDir, mode: 0o700}, entry{name: "private/key", typ: tar.TypeReg, mode: 0o600, body: "k"})
	d := t.TempDir()
	if err := Extract(bytes.NewReader(b), artifact.FormatTar, d, Options{ReadOnly: true, WorldReadable: true}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]fs.FileMode{"private": fs.ModeDir | 0o555, "private/key": 0o444} {
		if fi, err := os.Lstat(filepath.Join(d, p)); err != nil || fi.Mode() != want {
			t.Errorf("%s: %v %v, want %v", p, fi.Mode(), err, want)
		}
	}
}

// TestHostile has one case per kind of hostile entry; each must fail with its precise error and write nothing
// outside the destination.
func TestHostile(t *testing.T) {
	cases := []struct {
		name    string
		entries []entry
		opts    Options
		want    error
	}{
		{"dotdot", []entry{file("../evil", "x")}, Options{}, ErrUnsafePath},
		{"dotdot-inner", []entry{file("a/../../evil", "x")}, Options{}, ErrUnsafePath},
		{"absolute", []entry{file("/tmp/evil", "x")}, Options{}, ErrUnsafePath},
		{"symlink-escape", []entry{symlink("l", "../../outside")}, Options{}, ErrLinkEscape},
		{"symlink-absolute", []entry{symlink("l", "/etc/passwd")}, Options{}, ErrLinkEscape},
		{"write-through-symlink", []entry{symlink("l", "."), file("l/evil", "x")}, Options{}, ErrUnsafePath},
		{"write-through-symlink-abs", []entry{symlink("l", "/tmp"), file("l/evil", "x")}, Options{AbsoluteSymlinks: true}, ErrUnsafePath},
		{"hardlink-escape", []entry{hardlink("h", "../../etc/passwd")}, Options{}, ErrLinkEscape},
		{"hardlink-absolute", []entry{hardlink("h", "/etc/passwd")}, Options{}, ErrLinkEscape},
		{"hardlink-through-symlink", []entry{symlink("l", "."), file("f", "x"), hardlink("h", "l/f")}, Options{}, ErrLinkEscape},
		{"hardlink-to-symlink", []entry{symlink("l", "f"), hardlink("h", "l")}, Options{}, ErrLinkEscape},
		{"chardev", []entry{{name: "null", typ: tar.TypeChar, mode: 0o666}}, Options{}, ErrSpecialFile},
		{"blockdev", []entry{{name: "sda", typ: tar.TypeBlock, mode: 0o660}}, Options{}, ErrSpecialFile},
		{"fifo", []entry{{name: "pipe", typ: tar.TypeFifo, mode: 0o644}}, Options{}, ErrSpecialFile},
		{"too-many-bytes", []entry{file("a", strings.Repeat("x", 600)), file("b", strings.Repeat("x", 600))}, Options{Limits: Limits{MaxBytes: 1000}}, ErrTooLarge},
		{"too-many-files", []entry{file("a", ""), file("b", ""), file("c", "")}, Options{Limits: Limits{MaxFiles: 2}}, ErrTooLarge},
		{"whiteout-dotdot", []entry{file(".wh...", "")}, Options{}, ErrUnsafePath},
		// Each target stays inside on its own, but the kernel follows d (-> the destination) before the "..",
		// so a/q/e resolves to the destination's parent.
		{"symlink-escape-through-symlink", []entry{dir("a"), dir("a/q"), symlink("a/q/d", "../.."), symlink("a/q/e", "d/../evil")}, Options{}, ErrLinkEscape},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			parent := t.TempDir()
			d := filepath.Join(parent, "root", "dest")
			err := Extract(bytes.NewReader(makeTar(t, c.entries...)), artifact.FormatTar, d, c.opts)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			t.Log(err)
			// Nothing beside dest.
			entries, _ := os.ReadDir(filepath.Join(parent, "root"))
			if len(entries) != 1 {
				t.Errorf("wrote outside the destination: %v", entries)
			}
			if _, err := os.Lstat(filepath.Join(parent, "evil")); err == nil {
				t.Error("evil written outside")
			}
		})
	}
}

func TestBombGzip(t *testing.T) {
	// 64 MiB of zeros in one file compresses to ~64 KiB; a 1 MiB limit must stop it without writing it.
	var buf bytes.Buffer
	gw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gw)
	tw.WriteHeader(&tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Size: 64 << 20, Mode: 0o644})
	tw.Write(make([]byte, 64<<20))
	tw.Close()
	gw.Close()
	d := t.TempDir()
	err := Extract(&buf, artifact.FormatTarGzip, d, Options{Limits: Limits{MaxBytes: 1 << 20}})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err = %v, want ErrTooLarge", err)
	}
	if _, err := os.Stat(filepath.Join(d, "zeros")); err == nil {
		t.Error("bomb file written")
	}
}

func TestWhiteouts(t *testing.T) {
	lower := makeTar(t, dir("etc"), file("etc/a", "1"), file("etc/b", "2"), dir("opq"), file("opq/old", "o"), file("gone", "g"))
	upper := makeTar(t, file("etc/.wh.a", ""), dir("opq"), file("opq/.wh..wh..opq", ""), file("opq/new", "n"), file(".wh.gone", ""), file(".wh..wh.plnk", ""))

	t.Run("apply", func(t *testing.T) {
		d := t.TempDir()
		for _, l := range [][]byte{lower, upper} {
			if err := Extract(bytes.NewReader(l), artifact.FormatTar, d, Options{}); err != nil {
				t.Fatal(err)
			}
		}
		want := "etc dir 755\netc/b file 644 2\nopq dir 755\nopq/new file 644 n"
		if got := strings.Join(tree(t, d), "\n"); got != want {
			t.Errorf("got\n%s\nwant\n%s", got, want)
		}
	})
	t.Run("keep", func(t *testing.T) {
		d := t.TempDir()
		if err := Extract(bytes.NewReader(upper), artifact.FormatTar, d, Options{KeepWhiteouts: true}); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"etc/.wh.a", "opq/.wh..wh..opq", ".wh.gone"} {
			if fi, err := os.Lstat(filepath.Join(d, p)); err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
				t.Errorf("%s: %v %v", p, fi, err)
			}
		}
		if _, err := os.Lstat(filepath.Join(d, ".wh..wh.plnk")); err == nil {
			t.Error("AUFS metadata kept")
		}
	})
	t.Run("same-layer", func(t *testing.T) {
		// A whiteout hides lower layers only, never an entry of its own layer.
		d := t.TempDir()
		b := makeTar(t, file("x", "mine"), file(".wh.x", ""))
		if err := Extract(bytes.NewReader(b), artifact.FormatTar, d, Options{}); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(d, "x")); err != nil {
			t.Error("whiteout removed an entry of its own layer")
		}
	})
}

func TestReplaceEntries(t *testing.T) {
	// Later entries win: a file replaced by a directory and a directory by a symlink.
	b := makeTar(t, file("a", "file"), dir("a"), file("a/in", "1"), dir("b"), file("b/x", "x"), symlink("b", "a"))
	d := t.TempDir()
	if err := Extract(bytes.NewReader(b), artifact.FormatTar, d, Options{}); err != nil {
		t.Fatal(err)
	}
	want := "a dir 755\na/in file 644 1\nb symlink a"
	if got := strings.Join(tree(t, d), "\n"); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestTruncated(t *testing.T) {
	b := makeTar(t, entry{name: "f", typ: tar.TypeReg, mode: 0o644, body: "abc", size: 100})
	err := Extract(bytes.NewReader(b), artifact.FormatTar, t.TempDir(), Options{})
	if err == nil {
		t.Fatal("truncated archive extracted")
	}
}

func TestCleanPath(t *testing.T) {
	for in, want := range map[string]string{"a/b": "a/b", "./a//b/": "a/b", ".": "", "./": "", "a/./b": "a/b"} {
		if got, err := CleanPath(in); err != nil || got != want {
			t.Errorf("CleanPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"/a", "..", "a/../b", "a/..", "a\x00b"} {
		if _, err := CleanPath(in); !errors.Is(err, ErrUnsafePath) {
			t.Errorf("CleanPath(%q) err = %v", in, err)
		}
	}
}

// FuzzExtract feeds arbitrary bytes as a tar stream: extraction may fail but must never write outside the
// destination, leave a symlink pointing out of it, or panic.
func FuzzExtract(f *testing.F) {
	f.Add(makeTar(f, dir("a"), file("a/b", "x"), symlink("a/l", "b"), hardlink("h", "a/b")))
	f.Add(makeTar(f, file("../x", "x")))
	f.Add(makeTar(f, symlink("l", "../.."), file("l/x", "x")))
	f.Add(makeTar(f, file(".wh.a", ""), file("d/.wh..wh..opq", "")))
	f.Add(makeTar(f, entry{name: "dev", typ: tar.TypeChar}))
	f.Fuzz(func(t *testing.T, data []byte) {
		parent := t.TempDir()
		d := filepath.Join(parent, "dest")
		for _, keep := range []bool{false, true} {
			_ = Extract(bytes.NewReader(data), artifact.FormatTar, d, Options{KeepWhiteouts: keep, Limits: Limits{MaxBytes: 1 << 20, MaxFiles: 1000}})
		}
		entries, err := os.ReadDir(parent)
		if err != nil || len(entries) != 1 {
			t.Fatalf("wrote outside the destination: %v %v", entries, err)
		}
		filepath.WalkDir(d, func(p string, de fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if de.Type()&fs.ModeSymlink != 0 {
				target, _ := os.Readlink(p)
				if filepath.IsAbs(target) {
					t.Fatalf("absolute symlink %s -> %s", p, target)
				}
				resolved := filepath.Join(filepath.Dir(p), target)
				if rel, err := filepath.Rel(d, resolved); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
					t.Fatalf("symlink %s -> %s escapes", p, target)
				}
			}
			info, err := de.Info()
			if err == nil && info.Mode()&(fs.ModeDevice|fs.ModeNamedPipe|fs.ModeCharDevice|fs.ModeSetuid|fs.ModeSetgid) != 0 {
				t.Fatalf("special file %s", p)
			}
			return nil
		})
		// Clean up read-only trees so TempDir removal works without root.
		filepath.WalkDir(parent, func(p string, de fs.DirEntry, err error) error {
			if err == nil && de.IsDir() {
				os.Chmod(p, 0o755)
			}
			return nil
		})
	})
}

// Bombs are refused by the expansion ratio against the layer's declared size, under the default limits, before
// a byte of the offending file is written: a 10 KiB tar claiming a 10 GiB file (a sparse file's apparent size is
// what its header claims), and a gzip of a hundred-odd KiB expanding to 128 MiB.
func TestBombsStopAtTheExpansionRatio(t *testing.T) {
	var sparse bytes.Buffer
	tw := tar.NewWriter(&sparse)
	tw.WriteHeader(&tar.Header{Name: "pad", Typeflag: tar.TypeReg, Size: 8 << 10, Mode: 0o644})
	tw.Write(make([]byte, 8<<10))
	tw.WriteHeader(&tar.Header{Name: "sparse", Typeflag: tar.TypeReg, Size: 10 << 30, Mode: 0o644})
	tw.Flush() // the claimed bytes never follow: the limit must act on the header

	gzipped := func(size int) []byte {
		var gz bytes.Buffer
		gw := gzip.NewWriter(&gz)
		tw := tar.NewWriter(gw)
		tw.WriteHeader(&tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Size: int64(size), Mode: 0o644})
		tw.Write(make([]byte, size))
		tw.Close()
		gw.Close()
		return gz.Bytes()
	}
	bomb := gzipped(128 << 20)

	for _, tc := range []struct {
		name, file string
		b          []byte
		format     artifact.Format
	}{
		{"sparse tar", "sparse", sparse.Bytes(), artifact.FormatTar},
		{"gzip", "zeros", bomb, artifact.FormatTarGzip},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := t.TempDir()
			err := Extract(bytes.NewReader(tc.b), tc.format, d, Options{Size: int64(len(tc.b))})
			if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "expansion ratio") {
				t.Fatalf("a %d-byte layer: %v, want ErrTooLarge by the expansion ratio", len(tc.b), err)
			}
			if _, err := os.Lstat(filepath.Join(d, tc.file)); err == nil {
				t.Errorf("%s was written", tc.file)
			}
		})
	}
	// The absolute cap applies whatever the ratio, and a small layer fits under the ratio's floor.
	small := gzipped(4 << 20)
	err := Extract(bytes.NewReader(small), artifact.FormatTarGzip, t.TempDir(), Options{Size: 1 << 30, Limits: Limits{MaxBytes: 1 << 20}})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "size limit") {
		t.Fatalf("over MaxBytes: %v, want ErrTooLarge by the size limit", err)
	}
	if err := Extract(bytes.NewReader(small), artifact.FormatTarGzip, t.TempDir(), Options{Size: int64(len(small))}); err != nil {
		t.Fatalf("a small compressible layer under the floor: %v", err)
	}
}
