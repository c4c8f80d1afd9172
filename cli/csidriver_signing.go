package cli

import (
	"context"

	"github.com/spf13/pflag"

	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/csidriver"
	"github.com/modelpack/modelpack/csidriver/cachebackend"
	"github.com/modelpack/modelpack/scan"
	"github.com/modelpack/modelpack/signing"
)

// signingExtension is the signing part of `modelpack csi-driver`: --policy loads the node trust policy, and every
// artifact is verified by digest before any of its layers is pulled or mounted.
func signingExtension() csiDriverExtension {
	var policyPath string
	return csiDriverExtension{
		AddFlags: func(fs *pflag.FlagSet) {
			fs.StringVar(&policyPath, "policy", "", "node trust policy (YAML); reloaded on change. Empty: signatures are not checked. Signatures are read like models: --ca-file, --hosts-dir (mirrors too), --plain-http-registries, never https→http")
		},
		Setup: func(ctx context.Context, env *CSIDriverEnv) error {
			if policyPath == "" {
				env.Logger.Warn("no --policy: model signatures are not verified and model files are not scanned")
				return nil
			}
			p, err := signing.LoadPolicy(policyPath)
			if err != nil {
				return err
			}
			// Signatures travel the model's transport: its TLS settings, hosts.toml and plain-HTTP list.
			reg, err := remote.NewTransports(env.Remote)
			if err != nil {
				return err
			}
			v := signing.NewVerifier(p, reg)
			v.Log = env.Logger
			env.Driver.Collectors = append(env.Driver.Collectors, v.Collector())
			go v.WatchPolicy(ctx, policyPath, 0)
			// The volume's pull secret, in ctx (remote.WithCredential), reads its signatures too, from the origin
			// and from mirrors.
			// A refusal wraps signing.ErrDenied, which is the driver's ErrDenied (PERMISSION_DENIED).
			// Rules scoped to namespaces apply to the publishing pod's (csidriver.PodNamespace; none for prepulls).
			env.Verifier = cachebackend.VerifierFunc(func(ctx context.Context, digestRef string) error {
				_, err := v.VerifyIn(ctx, csidriver.PodNamespace(ctx), digestRef)
				return err
			})
			// The same policy (as reloaded) says which scanned files a model may hold.
			env.Screen = currentPolicy{v}
			env.Logger.Info("trust policy loaded", "path", policyPath, "version", p.Version())
			return nil
		},
	}
}

// currentPolicy is the verifier's policy of the moment, as a scan policy: a reload applies to the next publish.
type currentPolicy struct{ v *signing.Verifier }

func (c currentPolicy) ScanNeeded(namespace, ref string) bool {
	return c.v.Policy().ScanNeededIn(namespace, ref)
}

func (c currentPolicy) AllowsScan(namespace, ref, path string, r scan.Report) error {
	return c.v.Policy().AllowsScanIn(namespace, ref, path, r)
}
