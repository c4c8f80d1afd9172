package csidriver

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/modelpack/modelpack/csidriver/state"
)

type nodeServer struct {
	csi.UnimplementedNodeServer
	d *Driver
}

func (s *nodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	d := s.d
	target, attrs, creds, err := d.publishArgs(req)
	if err != nil {
		return nil, err
	}
	podName, podNS, podUID := podOf(req.GetVolumeContext())
	// The trust policy's namespace-scoped rules read it from here (Backend.Verify and Screen).
	ctx = WithPodNamespace(ctx, podNS)
	log := d.log.With("volume", req.GetVolumeId(), "target", target, "reference", attrs.Reference,
		"pod", podName, "namespace", podNS, "podUID", podUID)

	if !d.lockTarget(ctx, target) {
		return nil, fail(errRetry, "an operation on target %s is already in progress", target)
	}
	defer d.unlockTarget(target)

	if req.GetVolumeCapability().GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
		for t, v := range d.state.Snapshot().Volumes {
			if v.VolumeID == req.GetVolumeId() && t != target {
				return nil, fail(errPrecondition, "volume %s has access mode SINGLE_NODE_SINGLE_WRITER and is already published at %s", v.VolumeID, t)
			}
		}
	}

	fingerprint := attrs.Fingerprint(req.GetVolumeId(), req.GetReadonly(), req.GetVolumeCapability().GetMount().GetMountFlags()...)
	if old, ok := d.state.Snapshot().Volumes[target]; ok {
		if done, err := d.republish(ctx, old, fingerprint, creds); err != nil {
			return nil, err
		} else if done {
			return &csi.NodePublishVolumeResponse{}, nil
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
	defer img.done() // the view acquired (or the publish failed), the volume's reference holds the content
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
	}
	if err := d.publish(vol, attrs.Selector, log, start, tImage); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// publishArgs checks a publish request: the target, the capability, the attributes and the pull secret.
func (d *Driver) publishArgs(req *csi.NodePublishVolumeRequest) (string, *Attributes, Credentials, error) {
	bad := func(err error) (string, *Attributes, Credentials, error) { return "", nil, Credentials{}, err }
	target := req.GetTargetPath()
	switch {
	case req.GetVolumeId() == "":
		return bad(fail(errInvalidArgument, "volume id is required"))
	case target == "":
		return bad(fail(errInvalidArgument, "target path is required"))
	case !filepath.IsAbs(target):
		return bad(fail(errInvalidArgument, "target path %q is not absolute", target))
	}
	target = filepath.Clean(target)
	if err := d.checkTarget(target); err != nil {
		return bad(err)
	}
	if err := refuseLinksInTarget(target); err != nil {
		return bad(err)
	}
	if req.GetVolumeCapability() == nil {
		return bad(fail(errInvalidArgument, "volume capability is required"))
	}
	if err := checkCapabilities([]*csi.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return bad(err)
	}
	attrs, err := ParseAttributes(req.GetVolumeContext())
	if err != nil {
		return bad(fail(errInvalidArgument, "%s", err.Error()))
	}
	creds, err := credentialsFrom(req.GetSecrets())
	if err != nil {
		return bad(err)
	}
	return target, attrs, creds, nil
}

func (s *nodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	d := s.d
	if req.GetVolumeId() == "" {
		return nil, fail(errInvalidArgument, "volume id is required")
	}
	target := req.GetTargetPath()
	if target == "" {
		return nil, fail(errInvalidArgument, "target path is required")
	}
	target = filepath.Clean(target)
	if err := d.checkTarget(target); err != nil {
		return nil, err
	}
	// Unmounting or removing through a link would act on its destination.
	if err := refuseLinksInParents(target); err != nil {
		return nil, err
	}
	if !d.lockTarget(ctx, target) {
		return nil, fail(errRetry, "an operation on target %s is already in progress", target)
	}
	defer d.unlockTarget(target)

	vol, ok := d.state.Snapshot().Volumes[target]
	if !ok {
		if err := d.unpublishUnknown(target); err != nil {
			return nil, err
		}
		if err := d.backend.Release(ownerOf(target)); err != nil {
			return nil, fail(errNode, "release view of %s: %v", target, err)
		}
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	log := d.log.With("volume", vol.VolumeID, "target", target, "pod", vol.Pod.Name, "namespace", vol.Pod.Namespace, "podUID", vol.Pod.UID)
	if vol.VolumeID != req.GetVolumeId() {
		log.Warn("unpublish names another volume id than the one published here; unpublishing the target", "requested", req.GetVolumeId())
	}
	if err := d.undo(vol); err != nil {
		return nil, fail(errNode, "unpublish %s: %v", target, err)
	}
	log.Info("volume unpublished")
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (s *nodeServer) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, fail(errInvalidArgument, "volume id is required")
	}
	if req.GetVolumePath() == "" {
		return nil, fail(errInvalidArgument, "volume path is required")
	}
	path := filepath.Clean(req.GetVolumePath())
	vol, ok := s.d.state.Snapshot().Volumes[path]
	if !ok || vol.VolumeID != req.GetVolumeId() || vol.Phase != state.PhasePublished {
		return nil, fail(errNoVolume, "volume %s is not published at %s", req.GetVolumeId(), req.GetVolumePath())
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil {
		return nil, fail(errNode, "statfs %s: %v", path, err)
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
		return nil, fail(errInvalidArgument, "volume id is required")
	}
	var vols []state.Volume
	for _, v := range s.d.state.Snapshot().Volumes {
		if v.VolumeID == id && v.Phase == state.PhasePublished &&
			(req.GetVolumePublishPath() == "" || v.TargetPath == filepath.Clean(req.GetVolumePublishPath())) {
			vols = append(vols, v)
		}
	}
	if len(vols) == 0 {
		return nil, fail(errNoVolume, "volume %s is not published on this node", id)
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
