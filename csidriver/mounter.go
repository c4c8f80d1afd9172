package csidriver

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
	mount "k8s.io/mount-utils"
)

// bindMounter is mount-utils' mounter with the two operations a publish does — a bind mount and its read-only
// remount — and unmounts made as system calls. mount-utils runs mount(8) for each, which costs milliseconds per
// exec on every pod start, and the image has no mount(8) (it is the static binary and a CA bundle); everything
// else (mount point detection, corrupt-mount handling, listing) stays mount-utils', which reads /proc.
type bindMounter struct {
	mount.Interface
}

func newBindMounter() mount.Interface { return bindMounter{mount.NewWithoutSystemd("")} }

// Mount handles bind mounts with ro, nosuid, nodev and noexec, the only mounts the driver makes; anything else is
// refused rather than handed to mount(8), which the image does not have.
func (m bindMounter) Mount(source, target, fstype string, options []string) error {
	flags, attrs, ok := bindOptions(options)
	if !ok || fstype != "" {
		return fmt.Errorf("mount %s on %s: fstype %q options %q: only bind mounts (options bind, ro, nosuid, nodev, noexec; no fstype) are supported", source, target, fstype, options)
	}
	if err := bindWithAttrs(source, target, attrs); !errors.Is(err, unix.ENOSYS) {
		return err
	}
	// Kernels before 5.12: bind, then remount. The flags stay on this one mount and do not reach its propagated
	// copies.
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

// fdMounter mounts on a directory given as a descriptor (opened without following links: openTargetDir), so that
// the directory checked is the one mounted on. errors.ErrUnsupported: mount by path instead.
type fdMounter interface {
	MountOn(source string, target *os.File, options []string) error
}

// MountOn is Mount's bind with attributes onto an open directory; kernels before 5.12 and options other than
// Mount's own are unsupported.
func (m bindMounter) MountOn(source string, target *os.File, options []string) error {
	_, attrs, ok := bindOptions(options)
	if !ok {
		return errors.ErrUnsupported
	}
	err := bindWithAttrsAt(source, int(target.Fd()), "", unix.MOVE_MOUNT_T_EMPTY_PATH, attrs)
	if errors.Is(err, unix.ENOSYS) {
		return errors.ErrUnsupported
	}
	return err
}

// bindOptions reads a bind mount's options as mount flags and mount attributes; ok is false for anything else.
func bindOptions(options []string) (flags uintptr, attrs uint64, ok bool) {
	bind := false
	for _, o := range options {
		switch o {
		case "bind":
			bind = true
		case "ro":
			flags, attrs = flags|unix.MS_RDONLY, attrs|unix.MOUNT_ATTR_RDONLY
		case "nosuid":
			flags, attrs = flags|unix.MS_NOSUID, attrs|unix.MOUNT_ATTR_NOSUID
		case "nodev":
			flags, attrs = flags|unix.MS_NODEV, attrs|unix.MOUNT_ATTR_NODEV
		case "noexec":
			flags, attrs = flags|unix.MS_NOEXEC, attrs|unix.MOUNT_ATTR_NOEXEC
		default:
			return 0, 0, false
		}
	}
	return flags, attrs, bind
}

// bindWithAttrs binds source on target with the mount attributes already set when it appears. A remount sets a
// mount's flags on that one mount only: under the node plugin's Bidirectional mount of the kubelet directory,
// the copy propagated to the host — the one the kubelet hands to containers — would stay rw, suid and dev. A
// detached clone given its attributes first and then attached propagates with them.
func bindWithAttrs(source, target string, attrs uint64) error {
	return bindWithAttrsAt(source, unix.AT_FDCWD, target, 0, attrs)
}

// bindWithAttrsAt is bindWithAttrs onto (dirfd, path) as move_mount(2) names its destination, with toFlags
// (MOVE_MOUNT_T_EMPTY_PATH: dirfd itself).
func bindWithAttrsAt(source string, dirfd int, path string, toFlags int, attrs uint64) error {
	target := path
	if target == "" {
		target = fmt.Sprintf("directory fd %d", dirfd)
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, source, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return err
		}
		return &mountError{op: "clone " + source, err: err}
	}
	defer unix.Close(fd)
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: attrs}); err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return err
		}
		return &mountError{op: "set attributes of a clone of " + source, err: err}
	}
	if err := unix.MoveMount(fd, "", dirfd, path, unix.MOVE_MOUNT_F_EMPTY_PATH|toFlags); err != nil {
		return &mountError{op: "bind mount " + source + " on " + target, err: err}
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
