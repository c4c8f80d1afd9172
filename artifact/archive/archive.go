// Package archive extracts tar layers (plain, gzip or zstd) safely: every path is resolved relative to the
// destination with links never followed, entries that would land outside it are refused, device nodes and fifos are
// refused, setuid/setgid bits are stripped, and the total size and entry count are capped so that a decompression
// bomb fails early instead of filling the disk.
//
// It is shared by the node cache (image and model layers), `modelpack unpack` and `modelpack fetch`.
package archive

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/internal/diskio"
)

// Errors callers can test with errors.Is. Each is wrapped with the entry name and the reason.
var (
	// ErrUnsafePath: an absolute name, a ".." component, or a path through a symlink.
	ErrUnsafePath = errors.New("unsafe path")
	// ErrLinkEscape: a symlink or hardlink whose target is outside the destination.
	ErrLinkEscape = errors.New("link escapes the destination")
	// ErrSpecialFile: a character or block device, a fifo, or another entry type that has no place in a model.
	ErrSpecialFile = errors.New("special file refused")
	// ErrTooLarge: the archive is larger, or has more entries, than Limits allow (the project's one cause for
	// content over a limit, see internal/errdef).
	ErrTooLarge = artifact.ErrTooLarge
)

// Limits cap what one archive may write. Zero fields take DefaultLimits' values. Sizes are apparent sizes: a sparse
// file counts every byte it claims, holes included.
type Limits struct {
	// MaxBytes is the total uncompressed size of the archive's files, whatever the layer's size.
	MaxBytes int64 `json:"maxBytes,omitempty"`
	// MaxFiles is the number of entries (files, directories, links, whiteouts).
	MaxFiles int64 `json:"maxFiles,omitempty"`
	// MaxRatio caps the uncompressed size at this multiple of the layer's declared size (Options.Size), but never
	// below RatioFloor: a 4 MiB gzip cannot become 4 GiB, nor a 10 KiB tar a 10 GiB sparse file.
	MaxRatio float64 `json:"maxRatio,omitempty"`
}

// DefaultLimits fit the largest models published today (a tar layer of a few hundred GB, a million files; weights
// and code compress far less than 100:1) while stopping a bomb well before it fills a node's disk.
var DefaultLimits = Limits{MaxBytes: 1 << 40, MaxFiles: 1 << 20, MaxRatio: 100}

// RatioFloor is what any layer may expand to whatever its ratio, so small, very compressible layers (a few KiB
// of configuration) still fit.
const RatioFloor = 64 << 20

// Limits of a path in a layer, which the file system would otherwise refuse halfway through a pull
// (ENAMETOOLONG, an error of the node rather than of the content): a name is at most NAME_MAX bytes, and a path at
// most PATH_MAX (4096) less what the cache, a view and a pod's mount put before it.
const (
	MaxNameBytes = 255
	MaxPathBytes = 3072
)

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultLimits.MaxBytes
	}
	if l.MaxFiles <= 0 {
		l.MaxFiles = DefaultLimits.MaxFiles
	}
	if l.MaxRatio <= 0 {
		l.MaxRatio = DefaultLimits.MaxRatio
	}
	return l
}

// maxBytesFor is the byte limit of a layer of the declared size (0: unknown, only MaxBytes applies).
func (l Limits) maxBytesFor(size int64) int64 {
	if size <= 0 {
		return l.MaxBytes
	}
	byRatio := float64(size) * l.MaxRatio
	if byRatio >= float64(l.MaxBytes) {
		return l.MaxBytes
	}
	return min(max(int64(byRatio), RatioFloor), l.MaxBytes)
}

// limitError says which limit an archive hit and how to raise it.
func (x *extractor) limitError(what string) error {
	if x.maxBytes < x.opts.Limits.MaxBytes {
		return fmt.Errorf("%w: %s past %d bytes, %g times the layer's declared %d bytes (the expansion ratio limit)",
			ErrTooLarge, what, x.maxBytes, x.opts.Limits.MaxRatio, x.opts.Size)
	}
	return fmt.Errorf("%w: %s past %d bytes (the size limit)", ErrTooLarge, what, x.maxBytes)
}

// Options control an extraction.
type Options struct {
	Limits Limits
	// Size is the layer's declared (compressed) size, for Limits.MaxRatio; 0 applies only Limits.MaxBytes.
	Size int64
	// KeepWhiteouts writes whiteouts (.wh.<name>) and opaque markers (.wh..wh..opq) as empty files, for a later
	// merge of image layers. Without it they are applied: the named path, or the directory's earlier content, is
	// removed from dir, as when extracting image layers one over the other.
	KeepWhiteouts bool
	// ReadOnly clears the write bits of every file and directory written (views served to pods are read-only).
	ReadOnly bool
	// WorldReadable adds read permission for everyone to files, and read and search to directories, so a model
	// is readable by whatever user a pod runs as. Container images keep their own permissions.
	WorldReadable bool
	// AbsoluteSymlinks accepts symlinks with absolute targets. Container images are full of them (/bin/sh ->
	// /usr/bin/bash) and they resolve inside the container's root; model archives have no use for them.
	AbsoluteSymlinks bool
}

// Stats count what an extraction wrote.
type Stats struct {
	Entries int64 `json:"entries"`
	Bytes   int64 `json:"bytes"`
}

// Whiteout names (OCI image spec, "Representing Changes").
const (
	WhiteoutPrefix = ".wh."
	WhiteoutOpaque = ".wh..wh..opq"
)

// Extract extracts the archive r, encoded as f, into dir, creating dir if needed.
func Extract(r io.Reader, f artifact.Format, dir string, opts Options) error {
	_, err := Unpack(r, f, dir, opts)
	return err
}

// Unpack is Extract, returning what was written.
func Unpack(r io.Reader, f artifact.Format, dir string, opts Options) (Stats, error) {
	opts.Limits = opts.Limits.withDefaults()
	dr, err := Decompress(r, f)
	if err != nil {
		return Stats{}, err
	}
	defer dr.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Stats{}, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Stats{}, err
	}
	defer root.Close()
	x := &extractor{root: root, opts: opts, dirs: map[string]bool{}, created: map[string]bool{}, maxBytes: opts.Limits.maxBytesFor(opts.Size)}
	// Headers and padding are not file bytes but still cost decompression: allow them a generous, bounded share.
	budget := x.maxBytes + opts.Limits.MaxFiles*4096 + 4<<20
	lr := &limitedReader{r: dr, n: budget}
	if err := x.run(tar.NewReader(lr)); err != nil {
		if lr.n < 0 {
			return x.stats, x.limitError("the archive decompresses")
		}
		return x.stats, err
	}
	return x.stats, nil
}

// Decompress returns the tar stream of an archive encoded as f.
func Decompress(r io.Reader, f artifact.Format) (io.ReadCloser, error) {
	switch f {
	case artifact.FormatTar:
		return io.NopCloser(r), nil
	case artifact.FormatTarGzip:
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return zr, nil
	case artifact.FormatTarZstd:
		// Cap the decoder's window so a crafted frame header cannot make it allocate gigabytes.
		zr, err := zstd.NewReader(r, zstd.WithDecoderMaxMemory(256<<20), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		return zr.IOReadCloser(), nil
	case artifact.FormatRaw:
		return nil, errors.New("a raw layer is a single file, not an archive")
	}
	return nil, fmt.Errorf("unknown archive format %q", f)
}

type limitedReader struct {
	r io.Reader
	n int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n < 0 {
		return 0, ErrTooLarge
	}
	if int64(len(p)) > l.n+1 {
		p = p[:l.n+1]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	if l.n < 0 {
		return n, ErrTooLarge
	}
	return n, err
}

type dirMode struct {
	name string
	mode fs.FileMode
}

type extractor struct {
	root     *os.Root
	opts     Options
	maxBytes int64 // Limits.MaxBytes, or less by MaxRatio
	stats    Stats
	// dirs are paths known to be real directories (not symlinks), so parents are checked once.
	dirs map[string]bool
	// created are the paths this archive wrote: whiteouts only hide what was there before (OCI image spec).
	created map[string]bool
	// Directory modes are applied at the end: a read-only directory would refuse its own later entries.
	modes []dirMode
	buf   []byte // for file contents, allocated with the first file
}

// copyBufferSize: a multi-GB file costs few reads and writes; the size the node's blob ingests use (see cas).
const copyBufferSize = 256 << 10

func (x *extractor) run(tr *tar.Reader) error {
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if x.stats.Entries++; x.stats.Entries > x.opts.Limits.MaxFiles {
			return fmt.Errorf("%w: more than %d entries", ErrTooLarge, x.opts.Limits.MaxFiles)
		}
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
	}
	return x.finish()
}

// CleanPath validates an archive or layer path and returns it cleaned and relative ("" for the root itself). It
// refuses absolute paths, any ".." component and NUL bytes, rather than cleaning them away: such a name is never
// produced by honest tools.
func CleanPath(name string) (string, error) {
	if strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("%w: %q contains NUL", ErrUnsafePath, name)
	}
	if len(name) > MaxPathBytes {
		return "", fmt.Errorf("%w: a path of %d bytes (%.40q…) is over the limit of %d", ErrUnsafePath, len(name), name, MaxPathBytes)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: %q is absolute", ErrUnsafePath, name)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("%w: %q has a \"..\" component", ErrUnsafePath, name)
		}
		if len(c) > MaxNameBytes {
			return "", fmt.Errorf("%w: a name of %d bytes (%.40q…) in %.80q is over the limit of %d", ErrUnsafePath, len(c), c, name, MaxNameBytes)
		}
	}
	p := path.Clean(name)
	if p == "." {
		return "", nil
	}
	return p, nil
}

func (x *extractor) entry(hdr *tar.Header, tr io.Reader) error {
	name, err := CleanPath(hdr.Name)
	if err != nil {
		return err
	}
	if name == "" {
		return nil // the destination itself: its mode is the caller's business
	}
	base := path.Base(name)
	if strings.HasPrefix(base, WhiteoutPrefix) {
		return x.whiteout(name, base)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.dir(name, hdr.FileInfo().Mode())
	case tar.TypeReg, tar.TypeGNUSparse:
		return x.file(name, hdr, tr)
	case tar.TypeSymlink:
		return x.symlink(name, hdr.Linkname)
	case tar.TypeLink:
		return x.hardlink(name, hdr.Linkname)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return fmt.Errorf("%w: %q is a %s", ErrSpecialFile, name, typeName(hdr.Typeflag))
	case tar.TypeXGlobalHeader:
		return nil
	}
	return fmt.Errorf("%w: %q has unsupported tar type %q", ErrSpecialFile, name, hdr.Typeflag)
}

func typeName(t byte) string {
	switch t {
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeFifo:
		return "fifo"
	}
	return string(t)
}

func (x *extractor) whiteout(name, base string) error {
	parent := path.Dir(name)
	if base != WhiteoutOpaque {
		if strings.HasPrefix(base, WhiteoutPrefix+WhiteoutPrefix) {
			return nil // other AUFS metadata (.wh..wh.plnk, .wh..wh.aufs): meaningless outside AUFS
		}
		target := strings.TrimPrefix(base, WhiteoutPrefix)
		if target == "" || target == "." || target == ".." {
			return fmt.Errorf("%w: whiteout %q names no file", ErrUnsafePath, name)
		}
	}
	if x.opts.KeepWhiteouts {
		if err := x.parents(name); err != nil {
			return err
		}
		if err := x.replace(name, false); err != nil {
			return err
		}
		f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
		if err != nil {
			return err
		}
		x.created[name] = true
		return f.Close()
	}
	if err := x.checkParents(name); err != nil {
		return err
	}
	if base == WhiteoutOpaque {
		return x.clearDir(parent)
	}
	target := path.Join(parent, strings.TrimPrefix(base, WhiteoutPrefix))
	if x.created[target] {
		return nil
	}
	return x.remove(target)
}

// clearDir removes the entries of dir that this archive did not write (an opaque directory hides lower layers).
func (x *extractor) clearDir(dir string) error {
	entries, err := fs.ReadDir(x.root.FS(), dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := path.Join(dir, e.Name())
		if x.created[p] {
			continue
		}
		if err := x.remove(p); err != nil {
			return err
		}
	}
	return nil
}

func (x *extractor) remove(name string) error {
	fi, err := x.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		clear(x.dirs)
		if err := x.makeWritable(name); err != nil {
			return err
		}
	}
	return x.root.RemoveAll(name)
}

// makeWritable gives the owner write access to every directory under name so it can be removed without root.
func (x *extractor) makeWritable(name string) error {
	return fs.WalkDir(x.root.FS(), name, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Mode().Perm()&0o700 != 0o700 {
			return x.root.Chmod(p, info.Mode().Perm()|0o700)
		}
		return nil
	})
}

// parents makes sure every ancestor of name is a real directory, creating missing ones. A symlink among them is
// refused: following it could write anywhere.
func (x *extractor) parents(name string) error {
	dir := path.Dir(name)
	if dir == "." || x.dirs[dir] {
		return nil
	}
	p := ""
	for _, c := range strings.Split(dir, "/") {
		p = path.Join(p, c)
		if x.dirs[p] {
			continue
		}
		fi, err := x.root.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := x.root.Mkdir(p, 0o755); err != nil {
				return err
			}
			x.created[p] = true
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("%w: %q goes through symlink %q", ErrUnsafePath, name, p)
		case fi.IsDir():
			if fi.Mode().Perm()&0o700 != 0o700 {
				// A read-only directory from an earlier layer: open it for writing, restore its mode at the end.
				if err := x.root.Chmod(p, 0o755); err != nil {
					return err
				}
				x.modes = append(x.modes, dirMode{p, fi.Mode().Perm()})
			}
		default:
			// A file where a directory is needed: a later layer replaces it, as overlay filesystems do.
			if err := x.root.Remove(p); err != nil {
				return err
			}
			if err := x.root.Mkdir(p, 0o755); err != nil {
				return err
			}
			x.created[p] = true
		}
		x.dirs[p] = true
	}
	return nil
}

// checkParents is parents without creating anything: a whiteout of a path that does not exist is a no-op.
func (x *extractor) checkParents(name string) error {
	p := ""
	for _, c := range strings.Split(path.Dir(name), "/") {
		if c == "." {
			return nil
		}
		p = path.Join(p, c)
		fi, err := x.root.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%w: %q goes through symlink %q", ErrUnsafePath, name, p)
		}
	}
	return nil
}

// replace removes whatever is at name, unless both it and the new entry are directories (a later directory entry
// only changes the mode).
func (x *extractor) replace(name string, isDir bool) error {
	fi, err := x.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if isDir && fi.IsDir() {
		return nil
	}
	return x.remove(name)
}

func (x *extractor) dir(name string, mode fs.FileMode) error {
	if err := x.parents(name); err != nil {
		return err
	}
	if err := x.replace(name, true); err != nil {
		return err
	}
	if err := x.root.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	x.dirs[name] = true
	x.created[name] = true
	x.modes = append(x.modes, dirMode{name, x.perm(mode, 0o555)})
	return nil
}

// perm is the mode written for an entry: no setuid/setgid, no write bits for read-only extractions, and the
// readable bits added for world-readable ones.
func (x *extractor) perm(mode, readable fs.FileMode) fs.FileMode {
	p := mode.Perm()
	if x.opts.WorldReadable {
		p |= readable
	}
	if x.opts.ReadOnly {
		p &^= 0o222
	}
	return p
}

func (x *extractor) file(name string, hdr *tar.Header, r io.Reader) error {
	if hdr.Size < 0 {
		return fmt.Errorf("%w: %q has negative size", ErrUnsafePath, name)
	}
	if x.stats.Bytes+hdr.Size > x.maxBytes {
		return x.limitError(fmt.Sprintf("%q (%d bytes) takes the archive", name, hdr.Size))
	}
	if err := x.parents(name); err != nil {
		return err
	}
	if err := x.replace(name, false); err != nil {
		return err
	}
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := diskio.Preallocate(f, hdr.Size); err != nil {
		f.Close()
		return err
	}
	if x.buf == nil {
		x.buf = make([]byte, copyBufferSize)
	}
	// The struct hides *os.File's ReadFrom, whose fallback copies 32 KiB at a time.
	n, err := io.CopyBuffer(struct{ io.Writer }{f}, io.LimitReader(r, hdr.Size), x.buf)
	if err == nil && n != hdr.Size {
		err = fmt.Errorf("%q: archive truncated: %d of %d bytes: %w", name, n, hdr.Size, io.ErrUnexpectedEOF)
	}
	if err == nil {
		// Chmod through the open descriptor: no window in which name could be swapped for a link.
		err = f.Chmod(x.perm(hdr.FileInfo().Mode(), 0o444))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	x.stats.Bytes += hdr.Size
	x.created[name] = true
	if !hdr.ModTime.IsZero() {
		return x.root.Chtimes(name, hdr.ModTime, hdr.ModTime)
	}
	return nil
}

func (x *extractor) symlink(name, target string) error {
	if target == "" || strings.ContainsRune(target, 0) {
		return fmt.Errorf("%w: symlink %q has an empty or invalid target", ErrLinkEscape, name)
	}
	if len(target) > MaxPathBytes {
		return fmt.Errorf("%w: symlink %q has a target of %d bytes, over the limit of %d", ErrUnsafePath, name, len(target), MaxPathBytes)
	}
	if path.IsAbs(target) {
		if !x.opts.AbsoluteSymlinks {
			return fmt.Errorf("%w: symlink %q -> %q is absolute", ErrLinkEscape, name, target)
		}
	} else if resolved := path.Join(path.Dir(name), target); resolved == ".." || strings.HasPrefix(resolved, "../") {
		return fmt.Errorf("%w: symlink %q -> %q points outside", ErrLinkEscape, name, target)
	} else if dotDotAfterName(target) {
		// The lexical check above holds only if the ".." components climb through the link's real parents: after a
		// name, which may itself be a symlink, the kernel goes up from wherever that name leads.
		return fmt.Errorf("%w: symlink %q -> %q has a \"..\" after a name", ErrLinkEscape, name, target)
	}
	if err := x.parents(name); err != nil {
		return err
	}
	if err := x.replace(name, false); err != nil {
		return err
	}
	if err := x.root.Symlink(target, name); err != nil {
		return err
	}
	x.created[name] = true
	return nil
}

// dotDotAfterName reports whether a relative link target has a ".." component after a name component.
func dotDotAfterName(target string) bool {
	named := false
	for _, c := range strings.Split(target, "/") {
		switch c {
		case "", ".":
		case "..":
			if named {
				return true
			}
		default:
			named = true
		}
	}
	return false
}

func (x *extractor) hardlink(name, target string) error {
	old, err := CleanPath(target)
	if err != nil || old == "" {
		return fmt.Errorf("%w: hardlink %q -> %q points outside", ErrLinkEscape, name, target)
	}
	if old == name {
		return nil
	}
	if err := x.checkParents(old); err != nil {
		return fmt.Errorf("%w: hardlink %q -> %q: %v", ErrLinkEscape, name, target, err)
	}
	fi, err := x.root.Lstat(old)
	if err != nil {
		return fmt.Errorf("%w: hardlink %q -> %q: target not extracted: %v", ErrLinkEscape, name, target, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: hardlink %q -> %q: target is not a regular file", ErrLinkEscape, name, target)
	}
	if err := x.parents(name); err != nil {
		return err
	}
	if err := x.replace(name, false); err != nil {
		return err
	}
	if err := x.root.Link(old, name); err != nil {
		return err
	}
	x.created[name] = true
	return nil
}

// finish applies directory modes deepest first, so a read-only parent does not stop its children's chmod. A
// directory listed more than once keeps the mode declared last.
func (x *extractor) finish() error {
	final := map[string]fs.FileMode{}
	for _, m := range x.modes {
		final[m.name] = m.mode
	}
	names := make([]string, 0, len(final))
	for n := range final {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		if di, dj := strings.Count(names[i], "/"), strings.Count(names[j], "/"); di != dj {
			return di > dj
		}
		return names[i] < names[j]
	})
	for _, n := range names {
		fi, err := x.root.Lstat(n)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed by a later whiteout
		}
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			continue
		}
		if err := x.root.Chmod(n, final[n]); err != nil {
			return err
		}
	}
	return nil
}
