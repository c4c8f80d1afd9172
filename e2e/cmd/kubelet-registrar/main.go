// Command kubelet-registrar is the local cluster's stand-in for csi-node-driver-registrar, whose module is not on
// the Go proxy these tests build from; deploy/ keeps the real sidecar, and the test overlay passes this one the
// same flags. Like the real one it asks the driver for its name (CSI GetPluginInfo), serves the kubelet's
// plugin-registration API on /registration/<driver>-reg.sock, telling the kubelet where the driver's socket is on
// the host, and answers /healthz while that socket exists. It removes the socket on SIGTERM so the kubelet
// deregisters the driver.
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
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
		// The kubelet refused the driver (for example its NodeGetInfo failed): exit, so the pod restarts and retries.
		log.Fatalf("kubelet did not register %s: %s", r.driver, s.Error)
	}
	log.Printf("kubelet registered %s at %s", r.driver, r.endpoint)
	return &registration.RegistrationStatusResponse{}, nil
}

func main() {
	csiAddress := flag.String("csi-address", "/csi/csi.sock", "the driver's CSI socket in this container")
	endpoint := flag.String("kubelet-registration-path", "", "the driver's CSI socket as the kubelet (host) sees it")
	dir := flag.String("registration-dir", "/registration", "the kubelet's plugins_registry directory")
	httpEndpoint := flag.String("http-endpoint", "", "address serving /healthz (empty: none)")
	flag.Parse()
	if *endpoint == "" {
		log.Fatal("--kubelet-registration-path is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	driver, err := driverName(ctx, *csiAddress)
	if err != nil {
		log.Fatal(err)
	}
	sock := filepath.Join(*dir, driver+"-reg.sock")
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Fatal(err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		log.Fatal(err)
	}
	defer os.Remove(sock)
	srv := grpc.NewServer()
	registration.RegisterRegistrationServer(srv, &registrar{driver: driver, endpoint: *endpoint})
	if *httpEndpoint != "" {
		go func() {
			http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
				if _, err := os.Stat(sock); err != nil {
					http.Error(w, err.Error(), http.StatusServiceUnavailable)
				}
			})
			log.Fatal(http.ListenAndServe(*httpEndpoint, nil))
		}()
	}
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	log.Printf("serving plugin registration for %s (%s) on %s", driver, *endpoint, sock)
	if err := srv.Serve(l); err != nil {
		log.Print(err)
	}
}

// driverName waits for the driver's socket and asks the driver its name.
func driverName(ctx context.Context, address string) (string, error) {
	conn, err := grpc.NewClient("unix://"+address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	for {
		info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		if err == nil {
			return info.GetName(), nil
		}
		log.Printf("waiting for the driver at %s: %v", address, err)
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
