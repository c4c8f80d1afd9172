package testenv

import "github.com/container-storage-interface/spec/lib/go/csi"

// PublishRequest is the NodePublishVolume request kubelet sends for an inline, read-only-many volume.
func PublishRequest(volID, target string, attrs map[string]string) *csi.NodePublishVolumeRequest {
	return &csi.NodePublishVolumeRequest{
		VolumeId:      volID,
		TargetPath:    target,
		VolumeContext: attrs,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
		},
	}
}
