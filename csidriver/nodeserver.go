package csidriver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	digest "github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"

	"github.com/modelpack/modelpack/csidriver/access"
	"github.com/modelpack/modelpack/csidriver/state"
)

type nodeServer struct {
	csi.UnimplementedNodeServer
	d *Driver
}

// dockerConfigKey is the key of a kubernetes.io/dockerconfigjson secret.
const dockerConfigKey = ".dockerconfigjson"

func (s *nodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	d := s.d
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	target := req.GetTargetPath()
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "target path is required")
	}
	if !filepath.IsAbs(target) {
		return nil, status.Errorf(codes.InvalidArgument, "target path %q is not absolute", target)
	}
	target = filepath.Clean(target)
	if err := d.checkTarget(target); err != nil {
		return nil, err
	}
	if err := refuseLinkTarget(target); err != nil {
		return nil, err
	}
	if req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "volume capability is required")
	}
	if err := checkCapabilities([]*csi.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return nil, err
	}
	attrs, err := ParseAttributes(req.GetVolumeContext())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	creds, err := credentialsFrom(req.GetSecrets())
	if err != nil {
		return nil, err
	}
	podName, podNS, podUID := podOf(req.GetVolumeContext())
	log := d.log.With("volume", req.GetVolumeId(), "target", target, "reference", attrs.Reference,
		"pod", podName, "namespace", podNS, "podUID", podUID)

	if !d.lockTarget(ctx, target) {
		return nil, status.Errorf(codes.Aborted, "an operation on target %s is already in progress", target)
	}
	defer d.unlockTarget(target)

	if req.GetVolumeCapability().GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
		for t, v := range d.state.Snapshot().Volumes {
			if v.VolumeID == req.GetVolumeId() && t != target {
				return nil, status.Errorf(codes.FailedPrecondition, "volume %s has access mode SINGLE_NODE_SINGLE_WRITER and is already published at %s", v.VolumeID, t)
			}
		}
	}

	fingerprint := attrs.Fingerprint(req.GetVolumeId(), req.GetReadonly(), req.GetVolumeCapability().GetMount().GetMountFlags()...)
	if old, ok := d.state.Snapshot().Volumes[target]; ok {
		if old.Fingerprint != fingerprint {
			return nil, status.Errorf(codes.AlreadyExists, "target %s is already published for volume %s with other arguments", target, old.VolumeID)
		}
		if old.Phase == state.PhasePublished {
			if d.checkMount(old) != nil {
				// Repairing mounts the content again: the trust policy applies as to any other publish.
				if err := d.backend.Verify(ctx, old.Reference, digest.Digest(old.Digest), creds); err != nil {
					return nil, toStatus(err, "verify %s", old.Reference)
				}
			}
			if err := d.ensureMounted(old); err != nil {
				return nil, status.Errorf(codes.Internal, "repair mount of %s: %v", target, err)
			}
			return &csi.NodePublishVolumeResponse{}, nil
		}
		// A publish of this target crashed half way: start it again from a clean slate.
		if err := d.undo(old); err != nil {
			return nil, status.Errorf(codes.Internal, "clean up interrupted publish of %s: %v", target, err)
		}
	}

	start := time.Now()
	img, err := d.ensureImage(ctx, attrs, creds, podNS, log)
	tImage := time.Since(start)
	if err != nil {
		if status.Code(err) != codes.Aborted {
			log.Warn("publish failed", "code", status.Code(err).String(), "error", status.Convert(err).Message())
		} else {
			log.Info("publish waiting for pull", "progress", status.Convert(err).Message())
		}
		return nil, err
	}

	vol := state.Volume{
		VolumeID:    req.GetVolumeId(),
		TargetPath:  target,
		Fingerprint: fingerprint,
		Attributes:  attrs.Given,
		Reference:   attrs.Reference,
		Platform:    attrs.Platform,
		Digest:      img.Digest,
		Manifest:    img.Manifest,
		Owner:       ownerOf(target),
		SubPath:     attrs.SubPath,
		NoExec:      attrs.NoExec,
		Ephemeral:   req.GetVolumeContext()[keyEphemeral] == "true",
		Pod:         state.Pod{Name: podName, Namespace: podNS, UID: podUID},
		Phase:       state.PhaseMounting,
		UpdatedAt:   time.Now().UTC(),
	}
	if _, err := os.Lstat(target); errors.Is(err, fs.ErrNotExist) {
		vol.CreatedTarget = true
	}
	// The intent only has to survive the driver being killed, not the node losing power (which takes the mount
	// with it), so it is not synced to disk: the record of the finished publish below is.
	if err := d.stageVolume(vol); err != nil {
		return nil, status.Errorf(codes.Internal, "record publish of %s: %v", target, err)
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
		return nil, errKilled
	}
	tRecord := time.Since(start)
	source, err := d.acquireSource(vol, attrs.Selector)
	if err != nil {
		return nil, err
	}
	if killed = d.killed("acquired"); killed {
		return nil, errKilled
	}
	tAcquire := time.Since(start)
	vol.Source = source
	if err := d.mountTarget(vol); err != nil {
		return nil, status.Errorf(codes.Internal, "mount %s on %s: %v", source, target, err)
	}
	if killed = d.killed("mounted"); killed {
		return nil, errKilled
	}
	tMount := time.Since(start)
	vol.Phase = state.PhasePublished
	vol.UpdatedAt = time.Now().UTC()
	if err := d.putVolume(vol); err != nil {
		return nil, status.Errorf(codes.Internal, "record publish of %s: %v", target, err)
	}
	published = true
	log.Info("volume published", "digest", img.Digest, "manifest", img.Manifest, "subPath", attrs.SubPath,
		"image", tImage, "recorded", tRecord, "acquired", tAcquire, "mounted", tMount, "total", time.Since(start))
	return &csi.NodePublishVolumeResponse{}, nil
}

func (s *nodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	d := s.d
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	target := req.GetTargetPath()
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "target path is required")
	}
	target = filepath.Clean(target)
	if err := d.checkTarget(target); err != nil {
		return nil, err
	}
	if !d.lockTarget(ctx, target) {
		return nil, status.Errorf(codes.Aborted, "an operation on target %s is already in progress", target)
	}
	defer d.unlockTarget(target)

	vol, ok := d.state.Snapshot().Volumes[target]
	if !ok {
		if err := d.unpublishUnknown(target); err != nil {
			return nil, err
		}
		if err := d.backend.Release(ownerOf(target)); err != nil {
			return nil, status.Errorf(codes.Internal, "release view of %s: %v", target, err)
		}
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	log := d.log.With("volume", vol.VolumeID, "target", target, "pod", vol.Pod.Name, "namespace", vol.Pod.Namespace, "podUID", vol.Pod.UID)
	if vol.VolumeID != req.GetVolumeId() {
		log.Warn("unpublish names another volume id than the one published here; unpublishing the target", "requested", req.GetVolumeId())
	}
	if err := d.undo(vol); err != nil {
		return nil, status.Errorf(codes.Internal, "unpublish %s: %v", target, err)
	}
	log.Info("volume unpublished")
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (s *nodeServer) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	if req.GetVolumePath() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume path is required")
	}
	path := filepath.Clean(req.GetVolumePath())
	vol, ok := s.d.state.Snapshot().Volumes[path]
	if !ok || vol.VolumeID != req.GetVolumeId() || vol.Phase != state.PhasePublished {
		return nil, status.Errorf(codes.NotFound, "volume %s is not published at %s", req.GetVolumeId(), req.GetVolumePath())
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil {
		return nil, status.Errorf(codes.Internal, "statfs %s: %v", path, err)
	}
	bsize := int64(sfs.Bsize)
	// The volume is a view onto the node cache's filesystem, so these are the cache filesystem's figures.
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: int64(sfs.Blocks) * bsize, Available: int64(sfs.Bavail) * bsize, Used: int64(sfs.Blocks-sfs.Bfree) * bsize},
		{Unit: csi.VolumeUsage_INODES, Total: int64(sfs.Files), Available: int64(sfs.Ffree), Used: int64(sfs.Files - sfs.Ffree)},
	}}, nil
}

// NodeGetVolumeHealth reports a published volume whose mount is gone, corrupt (ENOTCONN, ESTALE…) or whose view
// vanished as INACCESSIBLE; the driver repairs it on the next publish of the target or at its next start.
func (s *nodeServer) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	var vols []state.Volume
	for _, v := range s.d.state.Snapshot().Volumes {
		if v.VolumeID == id && v.Phase == state.PhasePublished &&
			(req.GetVolumePublishPath() == "" || v.TargetPath == filepath.Clean(req.GetVolumePublishPath())) {
			vols = append(vols, v)
		}
	}
	if len(vols) == 0 {
		return nil, status.Errorf(codes.NotFound, "volume %s is not published on this node", id)
	}
	health := &csi.VolumeHealth{VolumeId: id}
	for _, v := range vols {
		if err := s.d.checkMount(v); err != nil {
			health.HealthStatuses = append(health.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
				Status:  csi.VolumeHealthErrorType_INACCESSIBLE,
				Reason:  "MountBroken",
				Message: fmt.Sprintf("%s: %v", v.TargetPath, err),
			})
			break
		}
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: health}, nil
}

func (s *nodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	rpc := func(t csi.NodeServiceCapability_RPC_Type) *csi.NodeServiceCapability {
		return &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}}}
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: []*csi.NodeServiceCapability{
		rpc(csi.NodeServiceCapability_RPC_GET_VOLUME_STATS),
		rpc(csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH),
		rpc(csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH),
		rpc(csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER),
	}}, nil
}

// NodeGetStorageHealth reports the node cache: unreachable until it is open.
func (s *nodeServer) NodeGetStorageHealth(context.Context, *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	resp := &csi.NodeGetStorageHealthResponse{}
	if err := s.d.backend.Ready(); err != nil {
		resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
			Status: csi.StorageHealthErrorType_STORAGE_UNREACHABLE, Reason: "CacheNotReady", Message: err.Error(),
		})
	}
	return resp, nil
}

func (s *nodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: s.d.opts.NodeID}, nil
}

// image is what a volume's reference came to on this node.
type image struct {
	Digest   string // top-level manifest or index
	Manifest string // the manifest mounted
}

func imageKey(ref, platform string) string { return ref + "|" + platform }

// ensureImage finds or pulls the content a volume names and checks it against the node's trust policy.
func (d *Driver) ensureImage(ctx context.Context, a *Attributes, creds Credentials, namespace string, log *slog.Logger) (image, error) {
	img, verified, err := d.findImage(ctx, a, creds, namespace, log)
	if err != nil || verified {
		return img, err
	}
	// Content already on the node is checked too: the policy may have changed since it was pulled, and the same
	// digest may have come from a repository under another rule.
	if err := d.backend.Verify(ctx, a.Reference, digest.Digest(img.Digest), creds); err != nil {
		return image{}, toStatus(err, "verify %s", a.Reference)
	}
	return img, nil
}

// findImage applies the pull policy: it finds the content on the node or pulls it, verifying a digest before any
// of its layers is pulled (verified reports that it did). Kubernetes' meanings: Never uses only what the node
// has; IfNotPresent asks the registry only when the node has nothing for the reference; Always asks the registry
// every time and fails if that fails, but downloads nothing the node already has. Content on the node is shared
// only as the access records allow (tenancy.go): a caller they do not vouch for is checked with the registry
// first — under Never with a manifest request for the digest the node holds, under IfNotPresent by resolving
// the reference as Always does.
func (d *Driver) findImage(ctx context.Context, a *Attributes, creds Credentials, namespace string, log *slog.Logger) (img image, verified bool, err error) {
	who, err := d.identify(ctx, a, creds, namespace)
	if err != nil {
		return image{}, false, err
	}
	local, haveLocal := d.localImage(a)
	if haveLocal && a.PullPolicy != PullAlways {
		key := accessKey(a, local.Digest)
		if d.allowed(key, who) {
			return local, false, nil
		}
		if a.PullPolicy == PullNever {
			if err := d.checkAccess(ctx, key, creds, who); err != nil {
				return image{}, false, err
			}
			return local, false, nil
		}
	}
	if a.PullPolicy == PullNever {
		return image{}, false, status.Errorf(codes.FailedPrecondition, "pullPolicy is Never and %s is not on this node", a.Reference)
	}
	// A registry too slow to answer within the budget gets the same ABORTED as a slow pull, in time for the
	// caller to read it.
	rctx, cancel := withBudget(ctx)
	dgst, err := d.backend.Resolve(rctx, a.Reference, creds)
	outOfTime := rctx.Err() != nil
	cancel()
	if err != nil {
		if outOfTime {
			return image{}, false, status.Errorf(codes.Aborted, "resolving %s did not finish before the deadline: %v", a.Reference, err)
		}
		if haveLocal {
			return image{}, false, refusal(err, accessKey(a, local.Digest), who)
		}
		return image{}, false, toStatus(err, "resolve %s", a.Reference)
	}
	if err := d.backend.Verify(ctx, a.Reference, dgst, creds); err != nil {
		return image{}, false, toStatus(err, "verify %s", a.Reference)
	}
	// The registry has just served dgst under this name to this caller: content of dgst the node holds, under
	// whatever name it came, is the caller's to read, as a cross-repository mount would make it.
	key := accessKey(a, dgst.String())
	if img, ok := d.knownImage(dgst, a.Platform); ok {
		if err := d.recordImage(a.Reference, a.Platform, img); err != nil {
			return image{}, false, status.Errorf(codes.Internal, "record image: %v", err)
		}
		if err := d.grant(ctx, key, who, access.ViaCheck); err != nil {
			return image{}, false, err
		}
		return img, true, nil
	}
	if err := d.access.Intend(key, who); err != nil {
		return image{}, false, status.Errorf(codes.Internal, "record pull of %s: %v", key, err)
	}
	job, joined := d.pulls.start(a.Reference, dgst, a.Platform, creds)
	if joined {
		log.Info("joining pull under way", "digest", dgst.String())
	}
	manifest, err := d.pulls.wait(ctx, job)
	if err != nil {
		if status.Code(err) != codes.Aborted {
			if aerr := d.access.Abandon(key, who); aerr != nil {
				log.Error("forget pull intent", "error", aerr.Error())
			}
		}
		return image{}, false, toStatus(err, "pull %s", a.Reference)
	}
	if err := d.grant(ctx, key, who, access.ViaPull); err != nil {
		return image{}, false, err
	}
	return image{Digest: dgst.String(), Manifest: manifest.String()}, true, nil
}

// localImage is what the reference names on this node, if that content is complete in the cache: for a tag,
// what it last resolved to here; for a digest, that digest's content under whatever name it came. Whether the
// caller may read it under this name is the access records' to say.
func (d *Driver) localImage(a *Attributes) (image, bool) {
	if rec, ok := d.state.Snapshot().Images[imageKey(a.Reference, a.Platform)]; ok && d.has(rec.Manifest) {
		return image{Digest: rec.Digest, Manifest: rec.Manifest}, true
	}
	if a.IsDigest() {
		dgst, _ := a.ref.Digest()
		if img, ok := d.knownImage(dgst, a.Platform); ok {
			return img, true
		}
		if a.Platform == "" {
			if m, ok := d.backend.Local(dgst); ok {
				return image{Digest: dgst.String(), Manifest: m.String()}, true
			}
		}
	}
	return image{}, false
}

// knownImage finds content already pulled for dgst and platform under any reference. Only callers the registry
// has just served dgst to, or whom the access records vouch for, may be handed it.
func (d *Driver) knownImage(dgst digest.Digest, platform string) (image, bool) {
	for _, rec := range d.state.Snapshot().Images {
		if rec.Digest == dgst.String() && rec.Platform == platform && d.has(rec.Manifest) {
			return image{Digest: rec.Digest, Manifest: rec.Manifest}, true
		}
	}
	return image{}, false
}

// has reports whether a recorded manifest is still complete in the cache.
func (d *Driver) has(manifest string) bool {
	_, ok := d.backend.Local(digest.Digest(manifest))
	return ok
}

// RecordImage records, as a pull by the driver does, that ref resolved to dgst whose manifest for platform (""
// for the node's) is in the cache: content another feature pulled into the cache (prepull) then counts as present
// for pullPolicy IfNotPresent and Never. ref is normalised as volume attributes are, so its record is the one a
// publish looks up. It holds for as long as the cache keeps the manifest, whether or not the caller still wants it.
func (d *Driver) RecordImage(ref, platform string, dgst, manifest digest.Digest) error {
	r, err := normalReference(ref)
	if err != nil {
		return fmt.Errorf("reference %q: %w", ref, err)
	}
	if platform != "" && !platformRE.MatchString(platform) {
		return fmt.Errorf("platform %q is not os/arch[/variant]", platform)
	}
	for _, dg := range []digest.Digest{dgst, manifest} {
		if err := dg.Validate(); err != nil {
			return fmt.Errorf("digest %q: %w", dg, err)
		}
	}
	if err := d.recordImage(r.String(), platform, image{Digest: dgst.String(), Manifest: manifest.String()}); err != nil {
		return err
	}
	// A prepull reads with the node's credentials for no pod in particular: kubelet's preloaded images, which the
	// access policy exempts from verification or not.
	k := access.Key{Host: r.Registry, Repository: r.Repository, Digest: dgst}
	if d.access.Has(k, access.Identity{Kind: access.Prepull}) {
		return nil
	}
	return d.access.Add(k, access.Identity{Kind: access.Prepull}, access.ViaPrepull)
}

func (d *Driver) recordImage(ref, platform string, img image) error {
	return d.state.Update(func(st *state.State) error {
		st.Images[imageKey(ref, platform)] = state.Image{
			Reference: ref, Platform: platform, Digest: img.Digest, Manifest: img.Manifest, ResolvedAt: time.Now().UTC(),
		}
		return nil
	})
}

func (d *Driver) recordPullStarted(j *pullJob) {
	err := d.state.Update(func(st *state.State) error {
		st.Pulls[j.stateKey()] = state.Pull{Reference: j.ref, Platform: j.platform, Digest: j.digest.String(), StartedAt: j.started.UTC()}
		return nil
	})
	if err != nil {
		d.log.Error("record pull", "error", err.Error())
	}
}

func (d *Driver) recordPullFinished(j *pullJob) {
	err := d.state.Update(func(st *state.State) error {
		// By what it records, not its key: a record of an earlier version's key goes too.
		for k, rec := range st.Pulls {
			if rec.Reference == j.ref && rec.Platform == j.platform && rec.Digest == j.digest.String() {
				delete(st.Pulls, k)
			}
		}
		if j.err == nil {
			st.Images[imageKey(j.ref, j.platform)] = state.Image{
				Reference: j.ref, Platform: j.platform, Digest: j.digest.String(), Manifest: j.manifest.String(), ResolvedAt: time.Now().UTC(),
			}
		}
		return nil
	})
	if err != nil {
		d.log.Error("record pull", "error", err.Error())
	}
}

// ownerPrefix marks the driver's holds on views in the cache, which it shares with other users (pins).
const ownerPrefix = "csi-"

// ownerOf names a target's hold on its view in the cache. It derives from the target alone so a hold whose
// record was lost (a crash between acquiring and recording) can still be found and released.
func ownerOf(target string) string {
	sum := sha256.Sum256([]byte(target))
	return ownerPrefix + hex.EncodeToString(sum[:12])
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
		return "", status.Errorf(codes.InvalidArgument, "subPath %q: %v", vol.SubPath, err)
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

// mountTarget bind-mounts vol.Source read-only onto the target, creating the target directory if needed.
func (d *Driver) mountTarget(vol state.Volume) error {
	if err := os.MkdirAll(vol.TargetPath, 0o750); err != nil {
		return err
	}
	// A mount left on the target (a lost state) would be hidden under ours; take it off first.
	if mnt, err := d.mounter.IsMountPoint(vol.TargetPath); err != nil || mnt {
		if err := d.unmountTarget(vol.TargetPath, false); err != nil {
			return err
		}
	}
	opts := []string{"bind", "ro", "nosuid", "nodev"}
	if vol.NoExec {
		opts = append(opts, "noexec")
	}
	if err := d.mounter.Mount(vol.Source, vol.TargetPath, "", opts); err != nil {
		// mount-utils binds then remounts read-only: a failed remount must not leave a writable bind behind.
		d.unmountTarget(vol.TargetPath, false)
		return err
	}
	return nil
}

// unmountTarget takes every mount off target (corrupt ones included) and, if remove, deletes the directory.
func (d *Driver) unmountTarget(target string, remove bool) error {
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
	return d.deleteVolume(vol.TargetPath)
}

func (d *Driver) putVolume(vol state.Volume) error {
	return d.updateVolumes(func(v map[string]state.Volume) { v[vol.TargetPath] = vol })
}

func (d *Driver) stageVolume(vol state.Volume) error {
	return d.state.UpdateNoSync(func(st *state.State) error {
		st.Volumes[vol.TargetPath] = vol
		return nil
	})
}

func (d *Driver) deleteVolume(target string) error {
	return d.updateVolumes(func(v map[string]state.Volume) { delete(v, target) })
}

// updateVolumes changes the durable volume records and keeps the volumes gauge in step with them.
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

// credentialsFrom reads the nodePublishSecretRef secret; no secret means the node's own credentials. A secret that
// is not a docker config is a bad credential (UNAUTHENTICATED), as the CSI spec treats bad secrets.
func credentialsFrom(secrets map[string]string) (Credentials, error) {
	if len(secrets) == 0 {
		return Credentials{}, nil
	}
	cfg, ok := secrets[dockerConfigKey]
	if !ok {
		keys := make([]string, 0, len(secrets))
		for k := range secrets {
			keys = append(keys, k)
		}
		return Credentials{}, status.Errorf(codes.Unauthenticated,
			"nodePublishSecretRef must be a kubernetes.io/dockerconfigjson secret with key %s (it has keys %s)", dockerConfigKey, strings.Join(keys, ", "))
	}
	var probe struct {
		Auths map[string]json.RawMessage `json:"auths"`
	}
	if err := json.Unmarshal([]byte(cfg), &probe); err != nil {
		// The parse error could quote the secret: say only where it is.
		return Credentials{}, status.Errorf(codes.Unauthenticated, "nodePublishSecretRef key %s is not valid JSON", dockerConfigKey)
	}
	return Credentials{DockerConfigJSON: []byte(cfg)}, nil
}
