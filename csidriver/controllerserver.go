package csidriver

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/status"

	"github.com/modelpack/modelpack/csidriver/state"
)

// controllerServer makes dynamic provisioning work without provisioning anything: CreateVolume validates the
// StorageClass parameters and returns them as the volume context, which the provisioner copies into the PV and
// kubelet hands to NodePublishVolume. Static PVs need no controller call at all.
type controllerServer struct {
	csi.UnimplementedControllerServer
	d *Driver
}

var errConflict = errors.New("conflict")

func (s *controllerServer) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	name := req.GetName()
	if name == "" {
		return nil, fail(errInvalidArgument, "name is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, fail(errInvalidArgument, "volume capabilities are required")
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	if req.GetVolumeContentSource() != nil {
		return nil, fail(errInvalidArgument, "volume content sources (snapshots, clones) are not supported: the content is the model named by the reference parameter")
	}
	params := map[string]string{}
	for k, v := range req.GetParameters() {
		// The provisioner's own keys (pvc name, namespace…) describe the claim, not the model.
		if !strings.HasPrefix(k, k8sPrefix) {
			params[k] = v
		}
	}
	if _, err := ParseAttributes(params); err != nil {
		return nil, fail(errInvalidArgument, "%s", err.Error())
	}
	capacity := req.GetCapacityRange().GetRequiredBytes()
	if capacity == 0 {
		capacity = req.GetCapacityRange().GetLimitBytes()
	}
	vol := state.ControllerVolume{ID: name, Name: name, Parameters: params, CapacityBytes: capacity}
	err := s.d.state.Update(func(st *state.State) error {
		if old, ok := st.ControllerVolumes[name]; ok {
			if old.CapacityBytes != vol.CapacityBytes || !maps.Equal(old.Parameters, vol.Parameters) {
				return errConflict
			}
			return nil
		}
		st.ControllerVolumes[name] = vol
		return nil
	})
	if errors.Is(err, errConflict) {
		return nil, fail(errExists, "volume %q exists with other parameters or capacity", name)
	}
	if err != nil {
		return nil, fail(errNode, "record volume %q: %v", name, err)
	}
	s.d.log.Info("volume created", "volume", name, "reference", params[AttrReference])
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{
		VolumeId:      vol.ID,
		CapacityBytes: vol.CapacityBytes,
		VolumeContext: vol.Parameters,
	}}, nil
}

func (s *controllerServer) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, fail(errInvalidArgument, "volume id is required")
	}
	err := s.d.state.Update(func(st *state.State) error {
		delete(st.ControllerVolumes, id)
		return nil
	})
	if err != nil {
		return nil, fail(errNode, "delete volume %q: %v", id, err)
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func (s *controllerServer) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, fail(errInvalidArgument, "volume id is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, fail(errInvalidArgument, "volume capabilities are required")
	}
	vol, ok := s.d.state.Snapshot().ControllerVolumes[id]
	if !ok {
		return nil, fail(errNoVolume, "volume %q does not exist", id)
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      vol.Parameters,
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

func (s *controllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	rpc := func(t csi.ControllerServiceCapability_RPC_Type) *csi.ControllerServiceCapability {
		return &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}}
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{
		rpc(csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME),
		rpc(csi.ControllerServiceCapability_RPC_LIST_VOLUMES),
	}}, nil
}

// ListVolumes pages through the created volumes in name order; the token is the last name of the previous page.
func (s *controllerServer) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, fail(errInvalidArgument, "max_entries must not be negative")
	}
	vols := s.d.state.Snapshot().ControllerVolumes
	names := slices.Sorted(maps.Keys(vols))
	start := 0
	if tok := req.GetStartingToken(); tok != "" {
		last, ok := strings.CutPrefix(tok, listTokenPrefix)
		if !ok {
			return nil, fail(errRetry, "starting token %q was not returned by ListVolumes", tok)
		}
		// Resume after the last volume returned, even if it was deleted since.
		start, _ = slices.BinarySearch(names, last)
		for start < len(names) && names[start] <= last {
			start++
		}
	}
	resp := &csi.ListVolumesResponse{}
	for _, name := range names[start:] {
		if req.GetMaxEntries() > 0 && len(resp.Entries) == int(req.GetMaxEntries()) {
			resp.NextToken = listTokenPrefix + resp.Entries[len(resp.Entries)-1].Volume.VolumeId
			break
		}
		v := vols[name]
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: &csi.Volume{
			VolumeId: v.ID, CapacityBytes: v.CapacityBytes, VolumeContext: v.Parameters,
		}})
	}
	return resp, nil
}

const listTokenPrefix = "after:"

// checkCapabilities accepts filesystem volumes in any access mode: the content is immutable and every mount is
// read-only whatever the mode, so writers simply cannot write. fsType is ignored (provisioners fill in a default);
// raw block volumes do not exist for a model.
func checkCapabilities(caps []*csi.VolumeCapability) error {
	for _, c := range caps {
		if c.GetBlock() != nil {
			return fail(errInvalidArgument, "block volumes are not supported: a model is mounted as a directory")
		}
		if c.GetMount() == nil {
			return fail(errInvalidArgument, "volume capability must have access type mount")
		}
		if c.GetAccessMode() == nil || c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_UNKNOWN {
			return fail(errInvalidArgument, "volume capability must have an access mode")
		}
	}
	return nil
}
