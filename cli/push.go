package cli

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/modelpack/modelpack/artifact/layout"
	"github.com/modelpack/modelpack/artifact/pack"
	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/scan"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/spf13/cobra"
)

func pushCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	var from string
	var referrers, refuseCode, attestScan, dryRun bool
	var sf *signFlags
	cmd := &cobra.Command{
		Use:   "push REF",
		Short: "Push an artifact from the local store to a registry",
		Long: `Push an artifact from the local store to a registry.

REF is registry/repository[:tag]; the artifact stored under REF (or under --from) is sent. Blobs the registry
already has are skipped after a HEAD request, so pushing the same model twice sends no layer bytes. A blob this
store pushed to or pulled from another repository of the same registry is mounted from there (the distribution
API's cross-repository mount), so it is not sent again either. Layers move concurrently and each is retried with
backoff on its own.

--dry-run lists the manifests and blobs that would be sent, after a HEAD request for each saying which the
registry already has (or would mount), and the tag that would be set or moved; it sends nothing (no upload, no
tag) and exits 0.`,
		Example: `  modelpack pack ./model -t registry.local:5000/org/model:v1 && modelpack push registry.local:5000/org/model:v1
  modelpack push registry.local:5000/org/model:v1 --from llama3:8b`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := registryRepo(args[0]); err != nil {
				return err
			}
			ref := withDefaultTag(args[0])
			local := ref
			if from != "" {
				local = from
			}
			if _, err := layout.ParseReference(local); err != nil {
				return err
			}
			store, err := layout.Open(g.Home)
			if err != nil {
				return err
			}
			defer store.Close()
			if local, err = store.Name(local); err != nil {
				return err
			}
			// As pack does: a file whose loading runs code is said before it leaves this machine (issue 35), and
			// --refuse-code stops the push before any request. What cannot be scanned is push's to report.
			ws := newWarnings(cmd, g)
			if attestScan && sf.key == "" {
				return usageErr("--attest-scan signs the scan report with the --sign key: add --sign KEY")
			}
			var reps []scan.FileReport
			var layers []string
			info, err := loadArtifact(cmd.Context(), store, local)
			if err == nil && info.Manifest != nil {
				if reps, err = scanLayers(store, local, info); err == nil {
					if err := codeFindings(reps, refuseCode, ws.add); err != nil {
						return err
					}
					for _, l := range info.Layers {
						layers = append(layers, l.Digest.String())
					}
				}
			}
			if attestScan && layers == nil {
				return fmt.Errorf("--attest-scan: %s could not be scanned (%v)", local, err)
			}
			dst, _, err := remote.NewRepository(ref, rf.options())
			if err != nil {
				return err
			}
			g.onInterrupt("the blobs %s already holds are skipped next time, and an upload over 8 MiB resumes from the offset the registry kept (the local store remembers its session); run `modelpack push %s` again to continue", dst.Reference.Registry, args[0])
			topts := remote.TransferOptions{Referrers: referrers, Sources: store, Sessions: store}
			if dryRun {
				if sf.key != "" {
					return usageErr("--dry-run sends nothing, so there is nothing to --sign")
				}
				plan, err := remote.PlanPush(cmd.Context(), store, local, dst, topts)
				if err != nil {
					return err
				}
				return printTransferPlan(cmd, g, "push", plan, ws.all())
			}
			ui := newTransferUI(cmd, g, "pushed")
			topts.Reporter = ui.reporter()
			res, err := remote.Push(cmd.Context(), store, local, dst, topts)
			ui.stop()
			if err != nil {
				return err
			}
			fillArtifactType(cmd.Context(), store, &res.Descriptor)
			sig, err := sf.signPushed(cmd.Context(), digestRef(dst, res), rf.options())
			if err != nil {
				return err
			}
			var att *scanAttestationJSON
			if attestScan {
				if att, err = attestReports(cmd.Context(), digestRef(dst, res), sf.key, reps, layers, false, rf.options()); err != nil {
					return err
				}
			}
			return ui.print(transferJSON{Result: res, Signature: sig, Attestation: att, Warnings: ws.all()})
		},
	}
	rf.register(cmd.Flags())
	cmd.Flags().BoolVar(&attestScan, "attest-scan", false, "also sign the scan report of the pushed digest with the --sign key, as modelpack scan --attest does (a cosign attestation a trust policy can require)")
	cmd.Flags().BoolVar(&refuseCode, "refuse-code", false, "fail, before sending anything, when a layer runs code when loaded or is malformed, as modelpack scan says (default: warn)")
	sf = addSignFlags(cmd.Flags())
	cmd.Flags().StringVar(&from, "from", "", "local store reference to push (default: REF)")
	_ = cmd.RegisterFlagCompletionFunc("from", completeRefs(g, -1))
	cmd.Flags().BoolVarP(&referrers, "referrers", "r", false, "also push the artifacts referring to it (signatures, SBOMs)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "list what would be sent and what the registry already has (HEAD requests only); send nothing")
	return cmd
}

// digestRef names what was pushed by digest, which is what gets signed.
func digestRef(repo *remote.Repository, res *remote.Result) string {
	return repo.Reference.Registry + "/" + repo.Reference.Repository + "@" + res.Descriptor.Digest.String()
}

// signingSink signs the manifest once the pack is committed in the registry, for pack --push --sign, and prints
// the push's summary as push does.
type signingSink struct {
	*remote.Sink
	repo         *remote.Repository
	sign         *signFlags
	ui           *transferUI
	opts         remote.Options
	artifactType string
	sig          *signatureJSON
}

func (s *signingSink) Commit(ctx context.Context, manifest ocispec.Descriptor, manifestBytes []byte, tag string) error {
	if err := s.Sink.Commit(ctx, manifest, manifestBytes, tag); err != nil {
		return err
	}
	var m ocispec.Manifest
	if json.Unmarshal(manifestBytes, &m) == nil {
		s.artifactType = m.ArtifactType
	}
	sig, err := s.sign.signPushed(ctx, digestRef(s.repo, s.Result()), s.opts)
	s.sig = sig
	return err
}

// printResult prints what was pushed (and signed), as push prints it, with the pack's warnings under -o json.
func (s *signingSink) printResult(warnings []string, summary *pack.Summary) error {
	s.ui.stop()
	res := s.Result()
	res.Descriptor.ArtifactType = s.artifactType
	return s.ui.print(transferJSON{Result: res, Signature: s.sig, Summary: summary, Warnings: warnings})
}

// packPushSink gives `pack --push` its sink: it adds the connection and signing flags to cmd and returns what
// streams the pack to the registry through a remote sink.
func packPushSink(cmd *cobra.Command, g *Globals) func(ctx context.Context, ref string) (pack.Sink, error) {
	rf := remoteFlags{g: g}
	rf.registerConnection(cmd.Flags())
	sf := addSignFlags(cmd.Flags())
	return func(ctx context.Context, ref string) (pack.Sink, error) {
		if _, err := registryRepo(ref); err != nil {
			return nil, err
		}
		repo, _, err := remote.NewRepository(withDefaultTag(ref), rf.options())
		if err != nil {
			return nil, err
		}
		// The local store keeps the upload sessions of large blobs, so a pack --push run again resumes them. No blob is
		// written to it and no lock held (Close has nothing to release).
		store, err := layout.Open(g.Home)
		if err != nil {
			return nil, err
		}
		ui := newTransferUI(cmd, g, "pushed")
		var rep remote.Reporter
		if !g.ShowProgress() {
			// On a TTY the pack command's own bar shows progress.
			rep = ui.reporter()
		}
		return &signingSink{Sink: remote.PackSink(repo, rep, store), repo: repo, sign: sf, ui: ui, opts: rf.options()}, nil
	}
}
