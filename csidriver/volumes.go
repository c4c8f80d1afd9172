package csidriver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	digest "github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"

	"github.com/modelpack/modelpack/csidriver/state"
)

// OwnerPrefix marks the driver's holds on views in the cache, which it shares with other users (pins). Each stands
// for a mount, which no restart of the machine leaves in place: a cache opened for the driver treats these owners
// as volatile (cache.Options.VolatileOwnerPrefix), so taking a hold waits for no flush to disk.
const OwnerPrefix = "csi-"

// ownerOf names a target's hold on its view in the cache. It derives from the target alone so a hold whose
// record was lost (a crash between acquiring and recording) can still be found and released.
func ownerOf(target string) string {
	sum := sha256.Sum256([]byte(target))
	return OwnerPrefix + hex.EncodeToString(sum[:12])
}

// acquireSource holds the view for vol and returns the directory to bind-mount: the view or its subPath.
func (d *Driver) acquireSource(vol state.Volume, sel Selector) (string, error) {
	view, err := d.backend.Acquire(vol.Owner, digest.Digest(vol.Manifest), sel)
	if err != nil {
		return "", toStatus(err, "acquire view of %s", vol.Manifest)
	}
	if vol.SubPath == "" {
		return view, nil
	}
	source, err := resolveInside(view, vol.SubPath)
	if err != nil {
		return "", fail(errInvalidArgument, "subPath %q: %v", vol.SubPath, err)
	}
	return source, nil
}

// resolveInside resolves sub within root, following symlinks but refusing any that lead out of root, and requires
// a directory.
func resolveInside(root, sub string) (string, error) {
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", err
	}
	p, err := filepath.EvalSymlinks(filepath.Join(realRoot, sub))
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("not found in the model")
	}
	if err != nil {
		return "", err
	}
	if !mount.PathWithinBase(p, realRoot) && p != realRoot {
		return "", fmt.Errorf("leads out of the model")
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("is not a directory")
	}
	return p, nil
}

// mountTarget bind-mounts vol.Source read-only onto the target, creating the target directory if needed, on the
// directory reached without following links (targets.go): a link on the way is INVALID_ARGUMENT.
func (d *Driver) mountTarget(vol state.Volume) error {
	if err := refuseLinksInTarget(vol.TargetPath); err != nil {
		return err
	}
	// A mount left on the target (a lost state) would be hidden under ours; take it off first.
	if mnt, err := d.mounter.IsMountPoint(vol.TargetPath); err != nil || mnt {
		if err := d.unmountTarget(vol.TargetPath, false); err != nil {
			return err
		}
	}
	dir, err := openTargetDir(vol.TargetPath)
	if err != nil {
		return linkStatus(err)
	}
	defer dir.Close()
	opts := []string{"bind", "ro", "nosuid", "nodev"}
	if vol.NoExec {
		opts = append(opts, "noexec")
	}
	err = errors.ErrUnsupported
	if fm, ok := d.mounter.(fdMounter); ok {
		err = fm.MountOn(vol.Source, dir, opts)
	}
	if errors.Is(err, errors.ErrUnsupported) {
		// By path (a kernel before 5.12, another mounter): checked again right before.
		if err = refuseLinksInTarget(vol.TargetPath); err == nil {
			err = d.mounter.Mount(vol.Source, vol.TargetPath, "", opts)
		}
	}
	if err != nil {
		// mount-utils binds then remounts read-only: a failed remount must not leave a writable bind behind.
		d.unmountTarget(vol.TargetPath, false)
		return err
	}
	return nil
}

// unmountTarget takes every mount off target (corrupt ones included) and, if remove, deletes the directory. A
// target that is a symbolic link holds no mount of ours (a mount point cannot be replaced): it is left alone, not
// followed.
func (d *Driver) unmountTarget(target string, remove bool) error {
	if fi, err := os.Lstat(target); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		return nil
	}
	for range 8 {
		mnt, err := d.mounter.IsMountPoint(target)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil && !mount.IsCorruptedMnt(err) {
			return err
		}
		if err == nil && !mnt {
			break
		}
		if err := d.mounter.Unmount(target); err != nil {
			return err
		}
	}
	if remove {
		if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// undo reverses a publish, whatever phase it reached: unmount, remove the target if the driver created it,
// release the view, forget the volume.
func (d *Driver) undo(vol state.Volume) error {
	if err := d.unmountTarget(vol.TargetPath, vol.CreatedTarget); err != nil {
		return err
	}
	if err := d.backend.Release(vol.Owner); err != nil {
		return fmt.Errorf("release view: %w", err)
	}
	if err := d.deleteVolume(vol.TargetPath); err != nil {
		return err
	}
	d.stopReadahead(vol.Source)
	return nil
}

func (d *Driver) putVolume(vol state.Volume) error {
	return d.updateVolumes(func(v map[string]state.Volume) { v[vol.TargetPath] = vol })
}

func (d *Driver) stageVolume(vol state.Volume) error {
	return d.state.Update(func(st *state.State) error {
		st.Volumes[vol.TargetPath] = vol
		return nil
	})
}

func (d *Driver) deleteVolume(target string) error {
	return d.updateVolumes(func(v map[string]state.Volume) { delete(v, target) })
}

// updateVolumes changes the volume records and keeps the volumes gauge in step with them.
func (d *Driver) updateVolumes(change func(map[string]state.Volume)) error {
	var n int
	err := d.state.Update(func(st *state.State) error {
		change(st.Volumes)
		n = len(st.Volumes)
		return nil
	})
	if err == nil {
		d.m.volumes.Set(float64(n))
	}
	return err
}

// checkMount reports what is wrong with a published target: not mounted, a corrupt mount (ENOTCONN, ESTALE…),
// or a view gone from under it.
func (d *Driver) checkMount(vol state.Volume) error {
	mnt, err := d.mounter.IsMountPoint(vol.TargetPath)
	if err != nil {
		if mount.IsCorruptedMnt(err) {
			return fmt.Errorf("mount is corrupt: %w", err)
		}
		return err
	}
	if !mnt {
		return errors.New("target is not mounted")
	}
	if _, err := os.Stat(vol.Source); err != nil {
		return fmt.Errorf("view is gone: %w", err)
	}
	if _, err := os.ReadDir(vol.TargetPath); err != nil {
		return fmt.Errorf("mount is unreadable: %w", err)
	}
	return nil
}

// ensureMounted repairs a published target that lost its mount or its view.
func (d *Driver) ensureMounted(vol state.Volume) error {
	problem := d.checkMount(vol)
	if problem == nil {
		return nil
	}
	d.log.Warn("repairing published volume", "target", vol.TargetPath, "problem", problem.Error())
	attrs, err := ParseAttributes(vol.Attributes)
	if err != nil {
		return fmt.Errorf("recorded attributes: %w", err)
	}
	if err := d.unmountTarget(vol.TargetPath, false); err != nil {
		return err
	}
	source, err := d.acquireSource(vol, attrs.Selector)
	if err != nil {
		return err
	}
	vol.Source = source
	if err := d.mountTarget(vol); err != nil {
		return err
	}
	vol.UpdatedAt = time.Now().UTC()
	return d.putVolume(vol)
}

// republish answers a publish of a target the state already records: with other arguments it is ALREADY_EXISTS;
// published, its mount is repaired if need be (done); a publish that crashed half way is undone, for the caller
// to start again from a clean slate.
func (d *Driver) republish(ctx context.Context, old state.Volume, fingerprint string, creds Credentials) (done bool, err error) {
	if old.Fingerprint != fingerprint {
		return false, fail(errExists, "target %s is already published for volume %s with other arguments", old.TargetPath, old.VolumeID)
	}
	if old.Phase != state.PhasePublished {
		if err := d.undo(old); err != nil {
			return false, fail(errNode, "clean up interrupted publish of %s: %v", old.TargetPath, err)
		}
		return false, nil
	}
	if d.checkMount(old) != nil {
		// Repairing mounts the content again: the trust policy applies as to any other publish.
		if err := d.backend.Verify(ctx, old.Reference, digest.Digest(old.Digest), creds); err != nil {
			return false, toStatus(err, "verify %s", old.Reference)
		}
	}
	if err := d.ensureMounted(old); err != nil {
		return false, fail(errNode, "repair mount of %s: %v", old.TargetPath, err)
	}
	return true, nil
}

// publish records vol, holds its view and mounts it, each step recorded before the next, so that a driver killed
// at any step finds the record (PhaseMounting) and undoes the rest; a publish that fails is undone at once.
// start and tImage time the log line: since the call began, and the image's share.
func (d *Driver) publish(vol state.Volume, sel Selector, log *slog.Logger, start time.Time, tImage time.Duration) error {
	vol.Phase, vol.UpdatedAt = state.PhaseMounting, time.Now().UTC()
	if _, err := os.Lstat(vol.TargetPath); errors.Is(err, fs.ErrNotExist) {
		vol.CreatedTarget = true
	}
	// Volume records, the intent as the finished publish below, only have to survive the driver being killed, not
	// the node losing power (which takes the mount with it): neither waits for the disk (package state).
	if err := d.stageVolume(vol); err != nil {
		return fail(errNode, "record publish of %s: %v", vol.TargetPath, err)
	}
	published, killed := false, false
	defer func() {
		if !published && !killed {
			if err := d.undo(vol); err != nil {
				log.Error("clean up failed publish", "error", err.Error())
			}
		}
	}()

	if killed = d.killed("staged"); killed {
		return errKilled
	}
	tRecord := time.Since(start)
	source, err := d.acquireSource(vol, sel)
	if err != nil {
		return err
	}
	if killed = d.killed("acquired"); killed {
		return errKilled
	}
	tAcquire := time.Since(start)
	vol.Source = source
	if err := d.mountTarget(vol); err != nil {
		if status.Code(err) == codes.InvalidArgument {
			return err
		}
		return fail(errNode, "mount %s on %s: %v", source, vol.TargetPath, err)
	}
	if killed = d.killed("mounted"); killed {
		return errKilled
	}
	tMount := time.Since(start)
	vol.Phase = state.PhasePublished
	vol.UpdatedAt = time.Now().UTC()
	if err := d.putVolume(vol); err != nil {
		return fail(errNode, "record publish of %s: %v", vol.TargetPath, err)
	}
	published = true
	d.startReadahead(vol.Source)
	log.Info("volume published", "digest", vol.Digest, "manifest", vol.Manifest, "subPath", vol.SubPath,
		"image", tImage, "recorded", tRecord, "acquired", tAcquire, "mounted", tMount, "total", time.Since(start))
	return nil
}
