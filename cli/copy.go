package cli

import (
	"github.com/modelpack/modelpack/artifact/layout"
	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func copyCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	var from, to sideFlags
	var referrers, dryRun bool
	cmd := &cobra.Command{
		Use:     "copy SRC DST",
		Aliases: []string{"cp"},
		Short:   "Copy an artifact from one registry repository to another",
		Long: `Copy an artifact between registries, or between repositories of one registry, without a local copy.

Within one registry the blobs are mounted across repositories, so no layer bytes move. DST's tag defaults to
SRC's. The connection flags apply to both registries; --from-* and --to-* set them for one side, as oras copy
does (a TLS registry with its own CA on one side, a plain-HTTP one on the other). Between registries a blob over 8 MiB
goes through an upload session the local store remembers, so a copy run again after Ctrl-C sends only the rest.

--dry-run reads SRC's manifests and lists them and their blobs with, after a HEAD request for each, which DST
already has or would mount, and the tag that would be set or moved; it writes nothing (no blob, no manifest, no
tag) and exits 0.`,
		Example: `  modelpack copy registry.local:5000/team-a/model:v1 registry.local:5000/team-b/model
  modelpack copy -r registry.local:5000/org/model:v1 mirror.local/org/model:v1
  modelpack copy --from-ca-file ca.pem --to-plain-http registry.example.com/org/model:v1 127.0.0.1:5000/org/model`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := rf.options()
			srcOpts, dstOpts := from.apply(cmd, opts), to.apply(cmd, opts)
			srcRef, err := registryRef(args[0])
			if err != nil {
				return err
			}
			if _, err := registryRepo(args[1]); err != nil {
				return err
			}
			src, _, err := remote.NewRepository(srcRef.String(), srcOpts)
			if err != nil {
				return err
			}
			dst, _, err := remote.NewRepository(args[1], dstOpts)
			if err != nil {
				return err
			}
			if dryRun {
				plan, err := remote.PlanCopy(cmd.Context(), src, dst, remote.TransferOptions{Referrers: referrers})
				if err != nil {
					return err
				}
				return printTransferPlan(cmd, g, "copy", plan, nil)
			}
			// The local store keeps the upload sessions of large blobs sent between registries, so a copy run again
			// resumes them; nothing else of the copy touches it.
			store, err := layout.Open(g.Home)
			if err != nil {
				return err
			}
			defer store.Close()
			g.onInterrupt("the blobs %s already holds are skipped next time, and an upload over 8 MiB resumes from the offset the registry kept (the local store remembers its session); run `modelpack copy %s %s` again to continue", dst.Reference.Registry, args[0], args[1])
			ui := newTransferUI(cmd, g, "copied")
			res, err := remote.Copy(cmd.Context(), src, dst, remote.TransferOptions{Reporter: ui.reporter(), Referrers: referrers, Sessions: store})
			if err == nil {
				fillArtifactType(cmd.Context(), src, &res.Descriptor)
			}
			return ui.done(res, err)
		},
	}
	rf.register(cmd.Flags())
	from.register(cmd.Flags(), "from", "source")
	to.register(cmd.Flags(), "to", "destination")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "list what would be copied and what DST already has (reads and HEAD requests only); write nothing")
	cmd.Flags().BoolVarP(&referrers, "referrers", "r", false, "also copy the artifacts referring to it (signatures, SBOMs) and cosign's sha256-<hex>.sig/.att/.sbom tags, as cosign copy does")
	return cmd
}

// sideFlags are copy's --from-* or --to-* connection flags: set, they replace the shared flag for that side.
type sideFlags struct {
	prefix             string
	opts               remote.Options
	username, password string
}

func (f *sideFlags) register(fs *pflag.FlagSet, prefix, side string) {
	f.prefix = prefix
	fs.BoolVar(&f.opts.PlainHTTP, prefix+"-plain-http", false, "talk plain HTTP to the "+side+" registry")
	fs.BoolVar(&f.opts.Insecure, prefix+"-insecure", false, "skip verification of the "+side+" registry's TLS certificate")
	fs.StringVar(&f.opts.CAFile, prefix+"-ca-file", "", "PEM CA bundle to trust for the "+side+" registry")
	fs.StringVar(&f.opts.CertFile, prefix+"-cert-file", "", "client certificate (PEM) for the "+side+" registry")
	fs.StringVar(&f.opts.KeyFile, prefix+"-key-file", "", "client certificate key (PEM) for the "+side+" registry")
	fs.StringVar(&f.opts.RegistryConfig, prefix+"-registry-config", "", "docker config.json with credentials for the "+side+" registry")
	fs.StringVar(&f.username, prefix+"-username", "", "user name for the "+side+" registry")
	fs.StringVar(&f.password, prefix+"-password", "", "password or token for the "+side+" registry")
}

// apply returns shared with this side's flags, those given, in place of the shared ones.
func (f *sideFlags) apply(cmd *cobra.Command, shared remote.Options) remote.Options {
	o := shared
	for name, set := range map[string]func(){
		"plain-http":      func() { o.PlainHTTP = f.opts.PlainHTTP },
		"insecure":        func() { o.Insecure = f.opts.Insecure },
		"ca-file":         func() { o.CAFile = f.opts.CAFile },
		"cert-file":       func() { o.CertFile = f.opts.CertFile },
		"key-file":        func() { o.KeyFile = f.opts.KeyFile },
		"registry-config": func() { o.RegistryConfig = f.opts.RegistryConfig },
	} {
		if cmd.Flags().Changed(f.prefix + "-" + name) {
			set()
		}
	}
	if c := explicitCredential(f.username, f.password); c != nil {
		o.Credential = c
		o.Hints.Credentials = "check --" + f.prefix + "-username and --" + f.prefix + "-password; they override the credentials stored by login"
	}
	return o
}
