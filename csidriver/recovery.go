package csidriver

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/csidriver/state"
)

// recover reconciles the persisted state with the node after a restart (a SIGKILL included): it finishes or undoes
// what was half done, collects volumes whose pods vanished while the driver was down, repairs published targets
// whose mount broke, and resumes the pulls that were running.
func (d *Driver) recover(ctx context.Context) {
	st := d.state.Snapshot()
	for _, vol := range st.Volumes {
		if !d.tryLockTarget(vol.TargetPath) {
			continue
		}
		d.reconcile(vol)
		d.unlockTarget(vol.TargetPath)
	}
	d.releaseOrphanViews()
	d.forgetEvictedImages()
	if err := d.access.Forget(func(dg digest.Digest) bool { _, ok := d.backend.Local(dg); return ok }); err != nil {
		d.log.Error("forget access records of evicted content", "error", err.Error())
	}
	for _, p := range st.Pulls {
		dgst, err := digest.Parse(p.Digest)
		if err != nil {
			d.log.Error("dropping unreadable pull record", "digest", p.Digest, "error", err.Error())
			continue
		}
		// Secrets are never persisted: the resumed pull uses the node's credentials, and a kubelet retry that
		// carries the pod's secret joins or restarts it.
		d.log.Info("resuming pull interrupted by a restart", "reference", p.Reference, "digest", p.Digest)
		d.pulls.start(p.Reference, dgst, p.Platform, Credentials{})
	}
	d.m.volumes.Set(float64(len(d.state.Snapshot().Volumes)))
}

// releaseOrphanViews drops the driver's holds on views that no recorded volume accounts for (a crash between
// acquiring a view and recording it), so the cache can evict their content. After a lost state every hold may be
// a live pod's, so none is dropped here: each goes when kubelet unpublishes its target.
func (d *Driver) releaseOrphanViews() {
	if d.stateLost {
		return
	}
	owners, err := d.backend.Owners(OwnerPrefix)
	if err != nil {
		d.log.Error("list view holds", "error", err.Error())
		return
	}
	known := map[string]bool{}
	for _, v := range d.state.Snapshot().Volumes {
		known[v.Owner] = true
	}
	for _, o := range owners {
		if known[o] {
			continue
		}
		if err := d.backend.Release(o); err != nil {
			d.log.Error("release orphaned view hold", "owner", o, "error", err.Error())
			continue
		}
		d.m.collected.WithLabelValues("orphaned_view").Inc()
		d.log.Info("released orphaned view hold", "owner", o)
	}
}

// forgetEvictedImages drops what references resolved to when the cache no longer holds the content, so the records
// do not grow without bound as models come and go.
func (d *Driver) forgetEvictedImages() {
	var gone []string
	for key, img := range d.state.Snapshot().Images {
		if !d.has(img.Manifest) {
			gone = append(gone, key)
		}
	}
	if len(gone) == 0 {
		return
	}
	err := d.state.Update(func(st *state.State) error {
		for _, key := range gone {
			delete(st.Images, key)
		}
		return nil
	})
	if err != nil {
		d.log.Error("forget evicted images", "error", err.Error())
	}
}

// reconcile brings one recorded volume in line with the node. The caller holds the target, so no publish or
// unpublish of it is under way: a record still mounting is a publish that died half way.
func (d *Driver) reconcile(vol state.Volume) {
	log := d.log.With("volume", vol.VolumeID, "target", vol.TargetPath, "pod", vol.Pod.Name, "namespace", vol.Pod.Namespace, "podUID", vol.Pod.UID)
	collect := func(reason string) {
		if err := d.undo(vol); err != nil {
			log.Error("collect volume", "reason", reason, "error", err.Error())
			return
		}
		d.m.collected.WithLabelValues(reason).Inc()
		log.Info("volume collected", "reason", reason)
	}
	switch {
	case podGone(vol.TargetPath):
		collect("pod_gone")
	case vol.Phase != state.PhasePublished:
		collect("half_published")
	case !exists(vol.TargetPath):
		// Only the driver removes a target it published, so a missing one is an unpublish cut short.
		collect("unpublish_interrupted")
	default:
		if err := d.ensureMounted(vol); err != nil {
			// Kubelet's unpublish still cleans it; health reports it meanwhile.
			log.Error("cannot repair published volume", "error", err.Error())
		}
	}
}

// podGone reports whether the pod a target belongs to no longer exists. Kubelet creates the directory holding the
// target (…/pods/<uid>/volumes/kubernetes.io~csi/<volume>/) before publishing and removes it with the pod, so its
// absence means nobody will ever unpublish the target.
func podGone(target string) bool {
	_, err := os.Stat(filepath.Dir(target))
	return errors.Is(err, fs.ErrNotExist)
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return !errors.Is(err, fs.ErrNotExist)
}

// gcLoop collects volumes whose pods vanished while the driver ran but kubelet never unpublished them, and
// repairs published targets whose mount broke or whose view vanished (new containers of the pod then see the
// model again; kubelet never republishes a volume on its own).
func (d *Driver) gcLoop(ctx context.Context) {
	t := time.NewTicker(d.opts.GCInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, vol := range d.state.Snapshot().Volumes {
			if !d.tryLockTarget(vol.TargetPath) {
				continue
			}
			// Re-read under the lock: an unpublish may have finished in between.
			if cur, ok := d.state.Snapshot().Volumes[vol.TargetPath]; ok {
				d.reconcile(cur)
			}
			d.unlockTarget(vol.TargetPath)
		}
	}
}
