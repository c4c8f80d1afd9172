package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/modelpack/modelpack/artifact/remote"
)

func tagsCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	cmd := &cobra.Command{
		Use:   "tags REGISTRY/REPOSITORY",
		Short: "List the tags of a repository in a registry",
		Long: `List the tags of a registry repository, one a line, in the registry's order (as oras repo tags and
crane ls do). The connection flags are those of pull.`,
		Example: `  modelpack tags registry.local:5000/org/llama3
  modelpack tags --plain-http 127.0.0.1:5000/org/llama3 -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, err := registryRepo(args[0])
			if err != nil {
				return err
			}
			ref.Reference = ""
			repo, _, err := remote.NewRepository(ref.String(), rf.options())
			if err != nil {
				return err
			}
			tags := []string{}
			if err := repo.Tags(cmd.Context(), "", func(t []string) error {
				tags = append(tags, t...)
				return nil
			}); err != nil {
				return err
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), struct {
					Repository string   `json:"repository"`
					Tags       []string `json:"tags"`
				}{ref.String(), tags})
			}
			for _, t := range tags {
				fmt.Fprintln(cmd.OutOrStdout(), t)
			}
			return nil
		},
	}
	rf.registerConnection(cmd.Flags())
	return cmd
}
