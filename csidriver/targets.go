package csidriver

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	mount "k8s.io/mount-utils"
)

// ownDirs are the directories the driver keeps its content in: its state and Options.OwnDirs (the cache).
func (d *Driver) ownDirs() []string {
	dirs := []string{d.opts.StateDir}
	for _, o := range d.opts.OwnDirs {
		if o != "" {
			dirs = append(dirs, o)
		}
	}
	for i, o := range dirs {
		dirs[i] = realPath(o)
	}
	return dirs
}

// realPath resolves the symlinks of p's longest existing prefix, so that a path reaching a directory through a
// link compares as the directory.
func realPath(p string) string {
	p = filepath.Clean(p)
	rest := ""
	for {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Join(r, rest)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return filepath.Join(p, rest)
		}
		rest = filepath.Join(filepath.Base(p), rest)
		p = parent
	}
}

// within reports whether p is dir or lies under it (both clean and absolute).
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// checkTarget refuses a target the driver must never mount on or unmount: one inside its own directories (or
// above them, which a mount would hide), reached directly or through a link.
func (d *Driver) checkTarget(target string) error {
	real := realPath(target)
	for _, dir := range d.ownDirs() {
		if within(real, dir) || within(dir, real) {
			return fail(errInvalidArgument, "target path %q lies in or over the driver's own directory %s; kubelet never asks for that", target, dir)
		}
	}
	return nil
}

// unpublishUnknown is the unpublish of a target the state does not know (never published, already unpublished,
// or state lost). It still leaves no mount of the driver's and no empty directory behind, which is what the
// caller wants, and acts on nothing else: a symbolic link is not followed (nor deleted), a mount that is not a
// view of this driver is left in place, and a directory with content is not ours to delete.
func (d *Driver) unpublishUnknown(target string) error {
	fi, err := os.Lstat(target)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fail(errNode, "unpublish %s: %v", target, err)
	}
	if !fi.IsDir() {
		d.log.Warn("unpublish of an unknown target that is not a directory: left alone", "target", target, "type", fi.Mode().Type().String())
		return nil
	}
	ours, err := d.mountedView(target)
	if err != nil {
		return fail(errNode, "unpublish %s: %v", target, err)
	}
	if ours {
		if err := d.unmountTarget(target, false); err != nil {
			return fail(errNode, "unmount %s: %v", target, err)
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		d.log.Warn("unpublish of an unknown target leaves it: not empty, or a mount that is not the driver's", "target", target, "error", err.Error())
	}
	return nil
}

// mountedView reports whether target is itself a mount point of a bind mount whose source lies in one of the
// driver's own directories, as read from mountinfo: the mount's device and root (the path inside its file
// system) against those of the own directories.
func (d *Driver) mountedView(target string) (bool, error) {
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	type fsPath struct {
		dev  string
		path string
	}
	// containing is the mount holding p: the longest mount point that is p or a parent of it (the last one wins
	// when mounts stack).
	containing := func(p string) (mount.MountInfo, bool) {
		var best mount.MountInfo
		found := false
		for _, mi := range infos {
			if within(p, mi.MountPoint) && (!found || len(mi.MountPoint) >= len(best.MountPoint)) {
				best, found = mi, true
			}
		}
		return best, found
	}
	var own []fsPath
	for _, dir := range d.ownDirs() {
		if mi, ok := containing(dir); ok {
			rel, err := filepath.Rel(mi.MountPoint, dir)
			if err != nil {
				continue
			}
			own = append(own, fsPath{fmt.Sprintf("%d:%d", mi.Major, mi.Minor), filepath.Join(mi.Root, rel)})
		}
	}
	found := false
	for _, mi := range infos {
		if mi.MountPoint != target {
			continue
		}
		found = true
		dev := fmt.Sprintf("%d:%d", mi.Major, mi.Minor)
		ours := false
		for _, o := range own {
			if dev == o.dev && within(mi.Root, o.path) {
				ours = true
			}
		}
		if !ours {
			return false, nil // a foreign mount, possibly under or over one of ours: leave it all
		}
	}
	return found, nil
}

// Targets are reached without following symbolic links. kubelet creates a target's parents as directories (and
// owns them); a link among them, or at the target, would make the driver create and mount at its destination,
// which whoever could make the link chooses. So the path is walked from / one component at a time, each opened
// with O_NOFOLLOW, and the mount is made on the directory so opened (its descriptor), not on the path again:
// nothing can be swapped between the check and the mount.

// errLinkInTarget is a symbolic link met on the way to a target.
type errLinkInTarget struct{ target, link string }

func (e *errLinkInTarget) Error() string {
	return fmt.Sprintf("target_path %q: %s is a symbolic link; kubelet creates the target and its parents as directories", e.target, e.link)
}

// refuseLinksInTarget refuses (InvalidArgument, naming target_path) a target with a symbolic link among its
// existing parents or at itself. A missing part ends the check: there is nothing there to follow.
func refuseLinksInTarget(target string) error {
	return refuseLinks(target, target)
}

// refuseLinksInParents is refuseLinksInTarget for the target's parents only: an unpublish of a target that is
// itself a link acts on nothing (unpublishUnknown, unmountTarget) and succeeds, as kubelet needs.
func refuseLinksInParents(target string) error {
	return refuseLinks(target, filepath.Dir(target))
}

func refuseLinks(target, upTo string) error {
	f, err := walkTarget(upTo, false)
	if f != nil {
		f.Close()
	}
	var link *errLinkInTarget
	if !errors.As(err, &link) {
		return nil // missing parts or other errors: the operation itself meets them
	}
	link.target = target
	return linkStatus(link)
}

// linkStatus is err as InvalidArgument if it is an errLinkInTarget, else err.
func linkStatus(err error) error {
	var link *errLinkInTarget
	if errors.As(err, &link) {
		return fail(errInvalidArgument, "%s", link.Error())
	}
	return err
}

// openTargetDir opens the target directory (O_PATH), creating it and missing parents (0750), without following a
// symbolic link anywhere on the way (errLinkInTarget).
func openTargetDir(target string) (*os.File, error) {
	return walkTarget(target, true)
}

// walkTarget opens each component of the absolute, clean path target in turn from /, refusing symbolic links,
// and with create makes the missing ones. Without create a missing component ends the walk with its error.
func walkTarget(target string, create bool) (*os.File, error) {
	const flags = unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Open("/", flags, 0)
	if err != nil {
		return nil, err
	}
	walked := "/"
	for _, name := range strings.Split(strings.TrimPrefix(target, "/"), "/") {
		if name == "" {
			continue
		}
		next := filepath.Join(walked, name)
		nfd, err := unix.Openat(fd, name, flags, 0)
		if errors.Is(err, unix.ENOENT) && create {
			if err = unix.Mkdirat(fd, name, 0o750); err == nil || errors.Is(err, unix.EEXIST) {
				nfd, err = unix.Openat(fd, name, flags, 0)
			}
		}
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			var st unix.Stat_t
			if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = &errLinkInTarget{target: target, link: next}
			}
		}
		unix.Close(fd)
		if err != nil {
			var link *errLinkInTarget
			if errors.As(err, &link) {
				return nil, err
			}
			return nil, &fs.PathError{Op: "open", Path: next, Err: err}
		}
		fd, walked = nfd, next
	}
	return os.NewFile(uintptr(fd), target), nil
}
