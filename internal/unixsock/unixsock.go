// Package unixsock creates the unix sockets the node plugin serves on (the CSI socket, the prepull API): whoever
// can connect to one can mount models into any directory or make the node pull, so each is the driver's user's
// alone (0600) whatever the umask, in a directory nobody else can write to, and never taken from another process.
//
// How:
//   - the directory and every directory above it (and every one holding a link on the way to it) must belong
//     to root or to the driver's user; the directory itself must not be writable by group or others (someone
//     who can write there can swap the socket for theirs), and a directory above it may be only if it is sticky
//     (/tmp), where nobody can rename what is not theirs. A socket directory of the driver's that group or others may write to (an old 0777 hostPath) is
//     fixed: those write bits are taken off before anything in it is looked at, and the fix is logged. One of
//     another owner, or a sticky one, is refused.
//   - the socket is bound inside a private directory made for it (0700: nobody else can reach it there, even
//     for the moment its mode follows the umask), set to 0600, and renamed into place: it never exists under its
//     name with another mode.
//   - a lock file beside it (.NAME.lock, flock) is held while it is served, so two drivers on one node never both
//     take the name; an existing entry at the name is replaced only if it is a socket of the driver's user that
//     nothing answers on (left by a killed driver). A live socket, a socket of another user, or anything else
//     (a file, a link) is refused with an error naming it: it is never deleted.
//   - Close removes the socket only if it is still the one created.
package unixsock

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Mode is every socket's mode: the driver's user only.
const Mode = 0o600

// maxPath is the longest path a unix socket address holds (sun_path, with its terminating NUL).
const maxPath = len(unix.RawSockaddrUnix{}.Path)

// Listen serves a unix socket at path as described in the package comment. log receives the fix of a socket
// directory others could write to (slog.Default() if nil).
func Listen(path string, log *slog.Logger) (net.Listener, error) {
	if log == nil {
		log = slog.Default()
	}
	path = filepath.Clean(path)
	dir, name := filepath.Split(path)
	if name == "" || name == "." || name == ".." || name == "/" {
		return nil, fmt.Errorf("socket %s: no file name", path)
	}
	if dir == "" {
		dir = "."
	}
	if len(path) >= maxPath {
		return nil, fmt.Errorf("socket %s: longer than the %d bytes a socket address holds", path, maxPath-1)
	}
	// 0750 whatever the umask: the umask only ever takes bits away.
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := checkDir(dir, log); err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	lock, err := lockName(dir, name)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	l, err := bind(path, dir)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	l.lock = lock
	return l, nil
}

// checkDir enforces the directory rules of the package comment on dir (resolved) and the directories above it.
func checkDir(dir string, log *slog.Logger) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return err
	}
	// The path as given may reach the directory through links: whoever could replace one of them could redirect
	// the socket, so the directories holding them obey the rule for directories above the socket's.
	if abs != real {
		if err := checkAbove(filepath.Dir(abs)); err != nil {
			return err
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(real, &st); err != nil {
		return &fs.PathError{Op: "lstat", Path: real, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s is not a directory", real)
	}
	if me := uint32(os.Geteuid()); st.Uid != 0 && st.Uid != me {
		return fmt.Errorf("directory %s belongs to uid %d, not to root or the driver's user (uid %d): another user could replace the socket", real, st.Uid, me)
	}
	if st.Mode&0o022 != 0 {
		if st.Mode&unix.S_ISVTX != 0 {
			return fmt.Errorf("directory %s is shared (mode %04o, sticky): put the socket in a directory of its own", real, st.Mode&0o7777)
		}
		fixed := st.Mode & 0o7777 &^ 0o022
		if err := unix.Chmod(real, fixed); err != nil {
			return fmt.Errorf("directory %s is writable by others (mode %04o) and cannot be fixed: %w", real, st.Mode&0o7777, err)
		}
		log.Warn("socket directory was writable by group or others; write access taken off", "dir", real,
			"was", fmt.Sprintf("%04o", st.Mode&0o7777), "now", fmt.Sprintf("%04o", fixed))
	}
	if real == "/" {
		return nil
	}
	return checkAbove(filepath.Dir(real))
}

// checkAbove applies the rule for directories above the socket's to p and its parents, as they are named (a link
// among them is itself in a directory checked; where it leads is checked by checkDir).
func checkAbove(p string) error {
	me := uint32(os.Geteuid())
	for ; ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: p, Err: err}
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			if st.Uid != 0 && st.Uid != me {
				return fmt.Errorf("directory %s belongs to uid %d, not to root or the driver's user (uid %d): another user could replace the socket", p, st.Uid, me)
			}
			if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
				return fmt.Errorf("directory %s above the socket is writable by others (mode %04o): they could rename the socket's directory", p, st.Mode&0o7777)
			}
		}
		if p == "/" {
			return nil
		}
	}
}

// lockName takes the lock on the socket name (the package comment), released when the returned file closes.
func lockName(dir, name string) (*os.File, error) {
	lp := filepath.Join(dir, "."+name+".lock")
	f, err := os.OpenFile(lp, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", lp, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another process serves this socket (it holds %s)", lp)
		}
		return nil, fmt.Errorf("lock %s: %w", lp, err)
	}
	return f, nil
}

// bind creates the socket in a private directory, sets its mode and renames it to path, after checking what is
// there now.
func bind(path, dir string) (*listener, error) {
	if err := refuseExisting(path); err != nil {
		return nil, err
	}
	priv, err := os.MkdirTemp(dir, ".sock-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(priv)
	tmp := filepath.Join(priv, "s")
	name := tmp
	if len(name) >= maxPath {
		// Longer than a socket address holds (the final name may still fit): bound through the private
		// directory's descriptor instead, a short name for the same place.
		d, err := os.Open(priv)
		if err != nil {
			return nil, err
		}
		defer d.Close()
		name = fmt.Sprintf("/proc/self/fd/%d/s", d.Fd())
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		return nil, err
	}
	// The listener would unlink its bind name on Close; the name it is served under is path.
	l.SetUnlinkOnClose(false)
	fail := func(err error) (*listener, error) { l.Close(); return nil, err }
	if err := os.Chmod(tmp, Mode); err != nil {
		return fail(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(tmp, &st); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	return &listener{UnixListener: l, path: path, dev: st.Dev, ino: st.Ino}, nil
}

// refuseExisting lets bind replace what is at path only if it is a socket of the driver's user that nothing
// answers on.
func refuseExisting(path string) error {
	var st unix.Stat_t
	err := unix.Lstat(path, &st)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &fs.PathError{Op: "lstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("%s exists and is not a socket (%s): remove it if it is not needed", path, fs.FileMode(st.Mode&0o777)|typeOf(st.Mode))
	}
	if me := uint32(os.Geteuid()); st.Uid != me {
		return fmt.Errorf("%s is a socket of uid %d, not of the driver's user (uid %d): remove it if it is stale", path, st.Uid, me)
	}
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("another process serves %s", path)
	}
	if !errors.Is(err, unix.ECONNREFUSED) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%s: cannot tell whether it is in use: %w", path, err)
	}
	return nil // a stale socket of ours: the rename replaces it
}

func typeOf(m uint32) fs.FileMode {
	switch m & unix.S_IFMT {
	case unix.S_IFLNK:
		return fs.ModeSymlink
	case unix.S_IFDIR:
		return fs.ModeDir
	case unix.S_IFIFO:
		return fs.ModeNamedPipe
	case unix.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		return fs.ModeDevice
	}
	return 0
}

// listener removes its socket at Close if the name still holds it, then releases the name's lock.
type listener struct {
	*net.UnixListener
	path     string
	dev, ino uint64
	lock     *os.File
	once     sync.Once
}

func (l *listener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		var st unix.Stat_t
		if unix.Lstat(l.path, &st) == nil && st.Dev == l.dev && st.Ino == l.ino {
			os.Remove(l.path)
		}
		if l.lock != nil {
			l.lock.Close()
		}
	})
	return err
}

// Addr is the name the socket is served under (the listener was bound under a private one).
func (l *listener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }
