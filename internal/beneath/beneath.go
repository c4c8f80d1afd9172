// Package beneath reads a directory tree through descriptors, never following a symbolic link: every path is
// resolved from the descriptor of a directory opened once, with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) (or,
// on kernels without it, O_NOFOLLOW one component at a time), so a file or a parent directory swapped for a link
// between a check and a use is refused instead of followed. A file is opened once, checked on its descriptor
// (a regular file, the one the walk saw) and read from it; File.Unchanged tells whether it changed while read.
//
// Packing a model directory and hashing one for a signature read this way: what was checked is what is read.
package beneath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Errors callers can test with errors.Is; each comes wrapped in an *fs.PathError naming the path.
var (
	// ErrSymlink: the path, or a directory on the way to it, is a symbolic link.
	ErrSymlink = errors.New("is a symbolic link, or lies under one")
	// ErrNotRegular: the path is not a regular file (a directory, fifo, socket or device).
	ErrNotRegular = errors.New("is not a regular file")
	// ErrChanged: the file is not the one seen before, or changed while it was read.
	ErrChanged = errors.New("file changed")
	// ErrNotLocal: the path is absolute or has a ".." component.
	ErrNotLocal = errors.New("not a path inside the directory")
)

// Stat is what identifies a file and its content's version: the inode, its type and permissions, size and times.
type Stat struct {
	Dev, Ino     uint64
	Mode         fs.FileMode
	Size         int64
	Mtime, Ctime unix.Timespec
}

func statOf(st *unix.Stat_t) Stat {
	return Stat{Dev: st.Dev, Ino: st.Ino, Mode: fileMode(st.Mode), Size: st.Size, Mtime: st.Mtim, Ctime: st.Ctim}
}

// IsRegular reports whether the file is a regular file.
func (s Stat) IsRegular() bool { return s.Mode.IsRegular() }

// diff names what differs between two stats of what should be one unchanged file, "" if nothing does.
func (s Stat) diff(o Stat) string {
	switch {
	case s.Dev != o.Dev || s.Ino != o.Ino:
		return "it was replaced by another file"
	case s.Mode.Type() != o.Mode.Type():
		return "its type changed"
	case s.Size != o.Size:
		return fmt.Sprintf("its size changed from %d to %d bytes", s.Size, o.Size)
	case s.Mtime != o.Mtime:
		return "its modification time changed"
	case s.Ctime != o.Ctime:
		return "its status change time changed"
	}
	return ""
}

func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// Dir is a directory opened once; every path below it is resolved from its descriptor.
type Dir struct {
	f    *os.File
	name string
}

// OpenDir opens the directory the caller names. Links in name itself are followed (the caller chose it); nothing
// below it will be.
func OpenDir(name string) (*Dir, error) {
	fd, err := unix.Open(name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	return &Dir{f: os.NewFile(uintptr(fd), name), name: name}, nil
}

// Name is the path the directory was opened by, for messages.
func (d *Dir) Name() string { return d.name }

// Close releases the descriptor.
func (d *Dir) Close() error { return d.f.Close() }

// Stat is the directory's own.
func (d *Dir) Stat() (Stat, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(d.f.Fd()), &st); err != nil {
		return Stat{}, &fs.PathError{Op: "fstat", Path: d.name, Err: err}
	}
	return statOf(&st), nil
}

// Parent opens the directory holding d (its real parent, whatever path d was opened by).
func (d *Dir) Parent() (*Dir, error) {
	fd, err := unix.Openat(int(d.f.Fd()), "..", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	name := path.Join(d.name, "..")
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	return &Dir{f: os.NewFile(uintptr(fd), name), name: name}, nil
}

// Sub opens the directory at rel below d, through no link.
func (d *Dir) Sub(rel string) (*Dir, error) {
	fd, err := d.openat(rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	return &Dir{f: os.NewFile(uintptr(fd), d.join(rel)), name: d.join(rel)}, nil
}

// Lstat describes the entry at rel itself (a link is described, not followed), reached through no link.
func (d *Dir) Lstat(rel string) (Stat, error) {
	parent, base, err := d.parent(rel)
	if err != nil {
		return Stat{}, err
	}
	defer closeFD(parent, d.f)
	var st unix.Stat_t
	if err := unix.Fstatat(parent, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return Stat{}, &fs.PathError{Op: "lstat", Path: d.join(rel), Err: err}
	}
	return statOf(&st), nil
}

// Readlink is the target of the link at rel, reached through no other link.
func (d *Dir) Readlink(rel string) (string, error) {
	parent, base, err := d.parent(rel)
	if err != nil {
		return "", err
	}
	defer closeFD(parent, d.f)
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(parent, base, buf)
		if err == unix.EINVAL {
			// Not a link: what the caller saw as one was replaced since.
			return "", &fs.PathError{Op: "readlink", Path: d.join(rel), Err: fmt.Errorf("%w since it was listed: it is no longer a symbolic link", ErrChanged)}
		}
		if err != nil {
			return "", &fs.PathError{Op: "readlink", Path: d.join(rel), Err: err}
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// File is a regular file opened through no link, with the Stat its descriptor had when opened.
type File struct {
	*os.File
	stat Stat
}

// Opened is the file's Stat when it was opened.
func (f *File) Opened() Stat { return f.stat }

// Unchanged refuses (ErrChanged) a file whose inode, size or times differ from when it was opened: called after
// the last read, it proves the bytes read are one version of the file.
func (f *File) Unchanged() error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return &fs.PathError{Op: "fstat", Path: f.Name(), Err: err}
	}
	if why := f.stat.diff(statOf(&st)); why != "" {
		return &fs.PathError{Op: "read", Path: f.Name(), Err: fmt.Errorf("%w while it was read: %s", ErrChanged, why)}
	}
	return nil
}

// Same refuses (ErrChanged) a file that is not the one want describes (seen by an earlier Lstat or Open).
func (f *File) Same(want Stat) error {
	if why := want.diff(f.stat); why != "" {
		return &fs.PathError{Op: "open", Path: f.Name(), Err: fmt.Errorf("%w since it was listed: %s", ErrChanged, why)}
	}
	return nil
}

// Open opens the regular file at rel for reading, through no link. A fifo does not block it and a device is not
// read: the type is checked on the descriptor before anything is read, and anything but a regular file is
// ErrNotRegular.
func (d *Dir) Open(rel string) (*File, error) {
	if openHook != nil {
		openHook(d.join(rel))
	}
	fd, err := d.openat(rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "fstat", Path: d.join(rel), Err: err}
	}
	s := statOf(&st)
	if !s.IsRegular() {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "open", Path: d.join(rel), Err: fmt.Errorf("%w: %s", ErrNotRegular, Describe(s.Mode))}
	}
	// O_NONBLOCK only kept the open of a fifo from waiting for a writer; a regular file's reads never block.
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "fcntl", Path: d.join(rel), Err: err}
	}
	return &File{File: os.NewFile(uintptr(fd), d.join(rel)), stat: s}, nil
}

// openHook, if set, runs before Open resolves its path: the tests' seam between a check and a use.
var openHook func(name string)

// Entry is one thing Walk found.
type Entry struct {
	Rel  string // slash-separated, relative to the walked directory
	Stat Stat   // of the entry itself: a link is a link
}

// SkipDir, returned by a walk function for a directory, skips its contents.
var SkipDir = fs.SkipDir

// Walk calls fn for each entry below the directory at rel ("" or "." for d itself), parents before their
// contents, names in byte order, as filepath.WalkDir does. Each directory is opened from its parent's descriptor
// through no link, so a directory swapped for a link during the walk is refused, never entered.
func (d *Dir) Walk(rel string, fn func(Entry) error) error {
	start := d
	if rel != "" && rel != "." {
		sub, err := d.Sub(rel)
		if err != nil {
			return err
		}
		defer sub.Close()
		start = sub
	}
	return start.walk("", fn)
}

func (d *Dir) walk(prefix string, fn func(Entry) error) error {
	names, err := d.f.Readdirnames(-1)
	if err != nil {
		return &fs.PathError{Op: "readdir", Path: d.name, Err: unwrap(err)}
	}
	// Read from the start again if this directory is walked twice.
	if _, err := d.f.Seek(0, 0); err != nil {
		return &fs.PathError{Op: "seek", Path: d.name, Err: err}
	}
	sort.Strings(names)
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(int(d.f.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // removed since it was listed
			}
			return &fs.PathError{Op: "lstat", Path: d.join(name), Err: err}
		}
		e := Entry{Rel: path.Join(prefix, name), Stat: statOf(&st)}
		err := fn(e)
		if e.Stat.Mode.IsDir() {
			if err == SkipDir {
				continue
			}
			if err != nil {
				return err
			}
			sub, err := d.Sub(name)
			if err != nil {
				return err
			}
			err = sub.walk(e.Rel, fn)
			sub.Close()
			if err != nil {
				return err
			}
			continue
		}
		if err != nil && err != SkipDir {
			return err
		}
	}
	return nil
}

func unwrap(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Describe says what a non-regular file is, for messages.
func Describe(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "is a directory"
	case m&fs.ModeSymlink != 0:
		return "is a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "is a named pipe (fifo)"
	case m&fs.ModeSocket != 0:
		return "is a socket"
	case m&fs.ModeCharDevice != 0:
		return "is a character device"
	case m&fs.ModeDevice != 0:
		return "is a block device"
	}
	return "is a special file (" + m.Type().String() + ")"
}

func (d *Dir) join(rel string) string { return path.Join(d.name, rel) }

// Local reports whether rel is a relative path with no ".." component.
func Local(rel string) bool {
	if rel == "" || strings.HasPrefix(rel, "/") || strings.ContainsRune(rel, 0) {
		return false
	}
	for _, c := range strings.Split(rel, "/") {
		if c == ".." {
			return false
		}
	}
	return true
}

// parent opens the directory holding rel's last component and returns its descriptor (d's own for a name
// directly in d: the caller closes it with closeFD) and that component.
func (d *Dir) parent(rel string) (int, string, error) {
	rel = path.Clean(rel)
	if !Local(rel) || rel == "." {
		return -1, "", &fs.PathError{Op: "open", Path: d.join(rel), Err: ErrNotLocal}
	}
	dir, base := path.Split(rel)
	if dir == "" {
		return int(d.f.Fd()), base, nil
	}
	fd, err := d.openat(strings.TrimSuffix(dir, "/"), unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return -1, "", err
	}
	return fd, base, nil
}

func closeFD(fd int, own *os.File) {
	if fd != int(own.Fd()) {
		unix.Close(fd)
	}
}

// noOpenat2 makes openat take the per-component path, as on a kernel without openat2 (tests).
var noOpenat2 bool

// openat opens rel below d with flags, following no link on the way or at the end.
func (d *Dir) openat(rel string, flags int) (int, error) {
	rel = path.Clean(rel)
	name := d.join(rel)
	if !Local(rel) {
		return -1, &fs.PathError{Op: "open", Path: name, Err: ErrNotLocal}
	}
	flags |= unix.O_CLOEXEC
	if !noOpenat2 {
		for {
			fd, err := unix.Openat2(int(d.f.Fd()), rel, &unix.OpenHow{Flags: uint64(flags), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
			switch {
			case err == nil:
				return fd, nil
			case err == unix.EINTR || err == unix.EAGAIN: // EAGAIN: a rename raced the lookup (RESOLVE_BENEATH)
				continue
			case err == unix.ENOSYS:
				// No openat2 (before Linux 5.6, or a seccomp filter that hides it): walk the components.
			default:
				return -1, &fs.PathError{Op: "open", Path: name, Err: linkError(err)}
			}
			break
		}
	}
	return d.openComponents(rel, flags)
}

// openComponents opens rel one component at a time from d with O_NOFOLLOW, each directory from its parent's
// descriptor: a link anywhere fails with ELOOP (or ENOTDIR for a directory opened O_DIRECTORY through one).
func (d *Dir) openComponents(rel string, flags int) (int, error) {
	name := d.join(rel)
	parts := strings.Split(rel, "/")
	cur := int(d.f.Fd())
	for i, p := range parts {
		last := i == len(parts)-1
		fl := unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if last {
			fl = flags | unix.O_NOFOLLOW
		}
		fd, err := unix.Openat(cur, p, fl, 0)
		var st unix.Stat_t
		if err == unix.ENOTDIR && unix.Fstatat(cur, p, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			err = unix.ELOOP // O_DIRECTORY|O_NOFOLLOW on a link says ENOTDIR
		}
		if cur != int(d.f.Fd()) {
			unix.Close(cur)
		}
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: name, Err: linkError(err)}
		}
		cur = fd
	}
	return cur, nil
}

// linkError names a refused link for what it is: ELOOP (RESOLVE_NO_SYMLINKS, O_NOFOLLOW) and EXDEV
// (RESOLVE_BENEATH) mean the path went through one.
func linkError(err error) error {
	if err == unix.ELOOP || err == unix.EXDEV {
		return ErrSymlink
	}
	return err
}
