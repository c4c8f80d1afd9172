// Command kubelet-registrar is the local cluster's stand-in for csi-node-driver-registrar, whose module is not on
// the Go proxy these tests build from; deploy/ keeps the real sidecar. It serves the kubelet's plugin-registration
// API on <registration-dir>/<driver>-reg.sock and tells the kubelet where the driver's CSI socket is; the kubelet
// then calls the driver's NodeGetInfo itself. It removes its socket on SIGTERM so the kubelet deregisters the driver.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"google.golang.org/grpc"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type registrar struct {
	registration.UnimplementedRegistrationServer
	driver, endpoint string
}

func (r *registrar) GetInfo(context.Context, *registration.InfoRequest) (*registration.PluginInfo, error) {
	return &registration.PluginInfo{
		Type:              registration.CSIPlugin,
		Name:              r.driver,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registration.RegistrationStatus) (*registration.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		// The kubelet refused the driver (for example NodeGetInfo failed): exit so the pod restarts and retries.
		log.Fatalf("kubelet did not register %s: %s", r.driver, s.Error)
	}
	log.Printf("kubelet registered %s at %s", r.driver, r.endpoint)
	return &registration.RegistrationStatusResponse{}, nil
}

func main() {
	driver := flag.String("driver-name", "modelpack.csi.dev", "CSI driver name")
	endpoint := flag.String("kubelet-registration-path", "/var/lib/kubelet/plugins/modelpack.csi.dev/csi.sock", "the driver's CSI socket as the kubelet (host) sees it")
	dir := flag.String("registration-dir", "/registration", "the kubelet's plugins_registry directory")
	flag.Parse()

	sock := filepath.Join(*dir, *driver+"-reg.sock")
	if err := os.Remove(sock); err != nil && !os.IsNotExist(err) {
		log.Fatal(err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer()
	registration.RegisterRegistrationServer(srv, &registrar{driver: *driver, endpoint: *endpoint})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	log.Printf("serving plugin registration for %s on %s", *driver, sock)
	if err := srv.Serve(l); err != nil {
		log.Fatal(err)
	}
	os.Remove(sock)
}
