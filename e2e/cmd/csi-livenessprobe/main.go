// Command csi-livenessprobe is the local cluster's stand-in for the livenessprobe sidecar, whose module is not on
// the Go proxy these tests build from; deploy/ keeps the real one, and the test overlay passes this one the same
// flags. It answers /healthz with the driver's CSI Probe: 200 when the driver says it is ready.
package main

import (
	"context"
	"flag"
	"log"
	"net/http"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	csiAddress := flag.String("csi-address", "/csi/csi.sock", "the driver's CSI socket in this container")
	httpEndpoint := flag.String("http-endpoint", ":9808", "address serving /healthz")
	timeout := flag.Duration("probe-timeout", time.Second, "deadline of one CSI Probe")
	flag.Parse()
	conn, err := grpc.NewClient("unix://"+*csiAddress, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	identity := csi.NewIdentityClient(conn)
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), *timeout)
		defer cancel()
		resp, err := identity.Probe(ctx, &csi.ProbeRequest{})
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		case resp.GetReady() != nil && !resp.GetReady().GetValue():
			http.Error(w, "driver not ready", http.StatusServiceUnavailable)
		}
	})
	log.Printf("probing %s, serving /healthz on %s", *csiAddress, *httpEndpoint)
	log.Fatal(http.ListenAndServe(*httpEndpoint, nil))
}
