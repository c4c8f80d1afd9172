package cli

import (
	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/spf13/cobra"
)

func init() {
	register(func(g *Globals) *cobra.Command {
		var rf remoteFlags
		var referrers bool
		cmd := &cobra.Command{
			Use:     "copy SRC DST",
			Aliases: []string{"cp"},
			Short:   "Copy an artifact from one registry repository to another",
			Long: `Copy an artifact between registries, or between repositories of one registry, without a local copy.

Within one registry the blobs are mounted across repositories, so no layer bytes move. DST's tag defaults to
SRC's. The connection flags apply to both registries.`,
			Example: `  modelpack copy registry.local:5000/team-a/model:v1 registry.local:5000/team-b/model
  modelpack copy -r registry.local:5000/org/model:v1 mirror.local/org/model:v1`,
			Args: cobra.ExactArgs(2),
			RunE: func(cmd *cobra.Command, args []string) error {
				opts := rf.options()
				src, _, err := remote.NewRepository(withDefaultTag(args[0]), opts)
				if err != nil {
					return err
				}
				dst, _, err := remote.NewRepository(args[1], opts)
				if err != nil {
					return err
				}
				ui := newTransferUI(cmd, g, "copied")
				res, err := remote.Copy(cmd.Context(), src, dst, remote.TransferOptions{Reporter: ui.reporter(), Referrers: referrers})
				return ui.done(res, err)
			},
		}
		rf.register(cmd.Flags())
		cmd.Flags().BoolVarP(&referrers, "referrers", "r", false, "also copy the artifacts referring to it (signatures, SBOMs)")
		return cmd
	})
}
