package cli

import (
	"context"
	"errors"

	"github.com/spf13/pflag"

	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/csidriver"
	"github.com/modelpack/modelpack/csidriver/cachebackend"
	"github.com/modelpack/modelpack/signing"
)

// The signing extension of `modelpack csi-driver`: --policy loads the node trust policy, and every artifact is
// verified by digest before any of its layers is pulled or mounted. This file sorts before prepull_driver.go,
// so env.Verifier is set before the prepull API picks it up: prepull obeys the same policy.
func init() {
	var policyPath string
	registerCSIDriverExtension(csiDriverExtension{
		AddFlags: func(fs *pflag.FlagSet) {
			fs.StringVar(&policyPath, "policy", "", "node trust policy (YAML); reloaded on change. Empty: signatures are not checked. Signatures are read like models: --ca-file, --hosts-dir (mirrors too), --plain-http-registries, never https→http")
		},
		Setup: func(ctx context.Context, env *CSIDriverEnv) error {
			if policyPath == "" {
				env.Logger.Warn("no --policy: model signatures are not verified")
				return nil
			}
			p, err := signing.LoadPolicy(policyPath)
			if err != nil {
				return err
			}
			// Signatures travel the model's transport: its TLS settings, hosts.toml and plain-HTTP list.
			o := env.Remote
			o.PlainHTTPHosts = env.PlainHTTPRegistries
			reg, err := remote.NewTransports(o)
			if err != nil {
				return err
			}
			v := signing.NewVerifier(p, reg)
			v.Log = env.Logger
			env.Driver.Collectors = append(env.Driver.Collectors, v.Collector())
			go v.WatchPolicy(ctx, policyPath, 0)
			// The volume's pull secret, in ctx (remote.WithCredential), reads its signatures too, from the origin
			// and from mirrors.
			env.Verifier = cachebackend.VerifierFunc(func(ctx context.Context, digestRef string) error {
				_, err := v.Verify(ctx, digestRef)
				if errors.Is(err, signing.ErrDenied) {
					return policyDenial{err}
				}
				return err
			})
			env.Logger.Info("trust policy loaded", "path", policyPath, "version", p.Version())
			return nil
		},
	})
}

// policyDenial is a signing refusal that the driver also recognises as its own ErrDenied (PERMISSION_DENIED),
// keeping signing's message, which names the rule and the reason.
type policyDenial struct{ error }

func (e policyDenial) Unwrap() error        { return e.error }
func (e policyDenial) Is(target error) bool { return target == csidriver.ErrDenied }
