package cli

import (
	"fmt"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/artifact/layout"
	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/spf13/cobra"
)

func pullCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	var referrers bool
	cmd := &cobra.Command{
		Use:   "pull REF",
		Short: "Pull an artifact from a registry into the local store",
		Long: `Pull an artifact from a registry into the local store, tagged there as REF.

Every blob is verified against its digest before it is stored; a mismatch drops the bytes. Blobs already in the
store are skipped, and an interrupted download resumes where it stopped (HTTP Range), in this run or the next.
Mirrors configured in --hosts-dir are tried before the registry itself.`,
		Example: `  modelpack pull registry.local:5000/org/model:v1
  modelpack pull --plain-http 127.0.0.1:5000/org/model@sha256:…`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			parsed, err := registryRef(args[0])
			if err != nil {
				return err
			}
			ref := parsed.String()
			local, err := layout.ParseReference(ref)
			if err != nil {
				return err
			}
			src, _, err := remote.NewRepository(ref, rf.options())
			if err != nil {
				return err
			}
			store, err := layout.Open(g.Home)
			if err != nil {
				return err
			}
			defer store.Close()
			g.onInterrupt("the blobs verified so far stay in the local store (%s) and a partial download is kept to resume from its last byte; run `modelpack pull %s` again to continue", store.Root(), args[0])
			ui := newTransferUI(cmd, g, "pulled")
			// The blobs the store lacks must fit in the free space of its file system, checked before any is written.
			check := func(blobs []ocispec.Descriptor) error {
				var need int64
				for _, b := range blobs {
					if ok, err := store.Exists(cmd.Context(), b); err != nil || !ok {
						need += b.Size
					}
				}
				return needSpace(store.Root(), need, "free space there, or give --home another directory", nil)
			}
			res, err := remote.Pull(cmd.Context(), src, store, local, remote.TransferOptions{Reporter: ui.reporter(), Referrers: referrers, Sources: store, Check: check})
			ui.stop()
			if err != nil {
				return err
			}
			fillArtifactType(cmd.Context(), store, &res.Descriptor)
			ws := newWarnings(cmd, g)
			if isImageConfig(res.Descriptor.ArtifactType) {
				ws.add(fmt.Sprintf("%s is a container image, not a model; unpack writes its root filesystem only with --image-rootfs", ref))
			}
			return ui.print(transferJSON{Result: res, Warnings: ws.all()})
		},
	}
	rf.register(cmd.Flags())
	cmd.Flags().BoolVarP(&referrers, "referrers", "r", false, "also pull the artifacts referring to it (signatures, SBOMs)")
	return cmd
}
