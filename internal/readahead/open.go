package readahead

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// waitingHook, if set, is called once a readahead waits for the first open (tests open files then).
var waitingHook func(dir string)

// firstOpen returns when a file directly in dir or in a directory under it is opened, through any mount of them
// (inotify reports an open to the directory it was opened through; a pod's bind mount of a view is that view),
// when max has passed, or when ctx ends. It reports whether an open ended the wait. An error (no inotify, too
// many watches) ends it at once: the readahead then starts without waiting.
func firstOpen(ctx context.Context, dir string, max time.Duration) (bool, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return false, os.NewSyscallError("inotify_init1", err)
	}
	// Non-blocking, the descriptor is served by the runtime's poller, so a read deadline bounds the wait.
	f := os.NewFile(uintptr(fd), "inotify")
	defer f.Close()
	var dirs []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return err
	})
	if err != nil {
		return false, err
	}
	// Watched after the walk, which opens the directories and would be reported.
	for _, p := range dirs {
		if _, err := unix.InotifyAddWatch(fd, p, unix.IN_OPEN|unix.IN_ONLYDIR|unix.IN_DONT_FOLLOW); err != nil {
			return false, os.NewSyscallError("inotify_add_watch", err)
		}
	}
	if err := f.SetReadDeadline(time.Now().Add(max)); err != nil {
		return false, err
	}
	if waitingHook != nil {
		waitingHook(dir)
	}
	stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 16*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := f.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if fileOpened(buf[:n]) {
			return true, nil
		}
	}
}

// fileOpened reports whether the inotify events in b include the open of a file: not of a watched directory
// itself, nor of a directory in one (something listing the volume is not its pod reading).
func fileOpened(b []byte) bool {
	for len(b) >= unix.SizeofInotifyEvent {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		if ev.Mask&unix.IN_OPEN != 0 && ev.Mask&unix.IN_ISDIR == 0 && ev.Len > 0 {
			return true
		}
		next := unix.SizeofInotifyEvent + int(ev.Len)
		if next > len(b) {
			return false
		}
		b = b[next:]
	}
	return false
}
