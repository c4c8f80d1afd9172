package csidriver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

type identityServer struct {
	csi.UnimplementedIdentityServer
	d *Driver
}

func (s *identityServer) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	v := s.d.opts.Version
	if v == "" {
		v = "dev"
	}
	return &csi.GetPluginInfoResponse{Name: s.d.opts.DriverName, VendorVersion: v}, nil
}

func (s *identityServer) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
			Type: csi.PluginCapability_Service_CONTROLLER_SERVICE,
		}},
	}}}, nil
}

// Probe is ready only once the cache is open and while the state can be written: without either a publish could
// not be served. A state that cannot be written is not ready, with the cause (FAILED_PRECONDITION), so the
// liveness probe and the operator see why every publish would fail.
func (s *identityServer) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	ready := s.d.backend.Ready() == nil
	var cause error
	if ready {
		if cause = s.d.state.Writable(); cause != nil {
			ready = false
		}
	}
	answer := "ready"
	if !ready {
		answer = "not_ready"
	}
	s.d.m.probes.WithLabelValues(answer).Inc()
	if ready {
		s.d.m.ready.Set(1)
	} else {
		s.d.m.ready.Set(0)
	}
	if cause != nil {
		s.d.log.Warn("not ready", "error", cause.Error())
		return nil, fail(errPrecondition, "not ready: %v", cause)
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(ready)}, nil
}
