package cli

import (
	"context"
	"path/filepath"
	"strings"
	"sync"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/modelpack/modelpack/csidriver/cachebackend"
	"github.com/modelpack/modelpack/prepull"
)

// prepullExtension serves the prepull API next to the driver's CSI socket; `modelpack prepull` and the prepull DaemonSet talk to it.
func prepullExtension() csiDriverExtension {
	var (
		enabled     bool
		socket      string
		concurrency int
		bandwidth   string
	)
	return csiDriverExtension{
		AddFlags: func(fl *pflag.FlagSet) {
			fl.BoolVar(&enabled, "prepull", true, "serve the prepull API (node plugins; the controller needs none)")
			fl.StringVar(&socket, "prepull-socket", "", "unix socket of the prepull API (default: prepull.sock next to the CSI socket, "+prepull.DefaultSocket+" in the DaemonSet)")
			fl.IntVar(&concurrency, "prepull-concurrency", 2, "references prepulled at once; the rest wait as pending")
			fl.StringVar(&bandwidth, "prepull-bandwidth", "0", "cap on the registry reads of all prepulls together, bytes per second (e.g. 100MiB; 0 = no cap)")
		},
		Setup: func(ctx context.Context, env *CSIDriverEnv) error {
			if !enabled {
				return nil
			}
			if socket == "" {
				socket = filepath.Join(filepath.Dir(strings.TrimPrefix(env.Driver.Endpoint, "unix://")), "prepull.sock")
			}
			if concurrency < 1 {
				return usageErr("--prepull-concurrency must be at least 1")
			}
			bps, err := parseByteSize(bandwidth)
			if err != nil {
				return usageErr("--prepull-bandwidth: %w", err)
			}
			// Extensions set up after this one may still install the verifier, so the API starts with the
			// driver's gRPC server, once every Setup has run: prepull must never run without the policy mounts have.
			// By then the driver is built as well: each prepull is recorded in it as one of its own pulls would be,
			// so a pod mounting a prepulled tag with pullPolicy IfNotPresent needs no registry.
			var once sync.Once
			start := make(chan struct{})
			env.Driver.GRPCServices = append(env.Driver.GRPCServices, func(*grpc.Server) { once.Do(func() { close(start) }) })
			go func() {
				select {
				case <-start:
				case <-ctx.Done():
					return
				}
				be := cachebackend.New(env.Cache, cachebackend.Options{
					Remote:   env.Remote,
					Verifier: env.Verifier,
					Screen:   env.Screen,
				}).Prepuller(env.Instance, bps)
				log := env.Logger.With("component", "prepull")
				if err := prepull.Serve(ctx, socket, be, prepull.Options{Concurrency: concurrency, Logger: log}); err != nil {
					log.Error("prepull API stopped", "error", err.Error())
				}
			}()
			return nil
		},
	}
}
