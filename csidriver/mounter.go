package csidriver

import (
	"errors"

	"golang.org/x/sys/unix"
	mount "k8s.io/mount-utils"
)

// bindMounter is mount-utils' mounter with the two operations a publish does — a bind mount and its read-only
// remount — made as system calls. mount-utils runs mount(8) for each, which costs milliseconds per exec on
// every pod start; everything else (mount point detection, corrupt-mount handling, listing) stays mount-utils'.
type bindMounter struct {
	mount.Interface
}

func newBindMounter() mount.Interface { return bindMounter{mount.NewWithoutSystemd("")} }

// Mount handles bind mounts with ro, nosuid, nodev and noexec; any other request goes to mount-utils.
func (m bindMounter) Mount(source, target, fstype string, options []string) error {
	var flags uintptr
	bind := false
	for _, o := range options {
		switch o {
		case "bind":
			bind = true
		case "ro":
			flags |= unix.MS_RDONLY
		case "nosuid":
			flags |= unix.MS_NOSUID
		case "nodev":
			flags |= unix.MS_NODEV
		case "noexec":
			flags |= unix.MS_NOEXEC
		default:
			return m.Interface.Mount(source, target, fstype, options)
		}
	}
	if !bind || fstype != "" {
		return m.Interface.Mount(source, target, fstype, options)
	}
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return &mountError{op: "bind mount " + source + " on " + target, err: err}
	}
	// The flags of a bind mount only take effect on a remount of it.
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|flags, ""); err != nil {
		unix.Unmount(target, 0)
		return &mountError{op: "remount " + target, err: err}
	}
	return nil
}

// Unmount detaches target; mount-utils would run umount(8).
func (m bindMounter) Unmount(target string) error {
	if err := unix.Unmount(target, 0); err != nil {
		if errors.Is(err, unix.EBUSY) {
			// A process still has the volume open (a container shutting down): detach it now, the kernel frees it
			// when the last user goes.
			return unix.Unmount(target, unix.MNT_DETACH)
		}
		return &mountError{op: "unmount " + target, err: err}
	}
	return nil
}

type mountError struct {
	op  string
	err error
}

func (e *mountError) Error() string { return e.op + ": " + e.err.Error() }
func (e *mountError) Unwrap() error { return e.err }
