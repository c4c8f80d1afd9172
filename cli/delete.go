package cli

import (
	"bufio"
	"errors"
	"fmt"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/spf13/cobra"

	"github.com/modelpack/modelpack/artifact/remote"
)

func deleteCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	var force bool
	cmd := &cobra.Command{
		Use:   "delete REF",
		Short: "Delete a manifest from a registry (by tag or digest; every tag naming it goes with it)",
		Long: `Delete the manifest REF names from its registry, as oras manifest delete does. A tag is resolved to the
manifest's digest first: registries delete manifests, and with one every tag naming it. (modelpack rm removes a
name from the local store.)

Without --force the digest is shown and a y/yes answer read from stdin, whether or not it is a terminal, as oras
asks; any other answer (an empty stdin too) deletes nothing and exits 0 ("cancelled"). --force never asks and
treats a reference the registry does not hold as done ("missing"), as oras --force does. A registry that refuses
deletes (405 UNSUPPORTED) is named with how to enable them.`,
		Example: `  modelpack delete registry.local:5000/org/llama3:old
  modelpack delete --force registry.local:5000/org/llama3@sha256:…`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, err := registryRef(args[0])
			if err != nil {
				return asUsage(err)
			}
			repo, _, err := remote.NewRepository(ref.String(), rf.options())
			if err != nil {
				return err
			}
			opts := remote.DeleteOptions{IgnoreMissing: force}
			if !force {
				opts.Confirm = func(d ocispec.Descriptor) bool {
					fmt.Fprintf(cmd.ErrOrStderr(), "Delete the manifest %s (%s) and every tag naming it? [y/N] ", d.Digest, ref)
					line, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
					answer := strings.ToLower(strings.TrimSpace(line))
					fmt.Fprintln(cmd.ErrOrStderr())
					return answer == "y" || answer == "yes"
				}
			}
			desc, err := remote.Delete(cmd.Context(), repo, opts)
			status := "deleted"
			switch {
			case errors.Is(err, remote.ErrCancelled):
				status = "cancelled"
			case errors.Is(err, remote.ErrMissing):
				status = "missing"
			case err != nil:
				return err
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), struct {
					Reference  string              `json:"reference"`
					Status     string              `json:"status"`
					Descriptor *ocispec.Descriptor `json:"descriptor,omitempty"`
				}{ref.String(), status, descOrNil(desc)})
			}
			switch status {
			case "cancelled":
				fmt.Fprintf(cmd.OutOrStdout(), "Cancelled: %s not deleted\n", ref)
			case "missing":
				fmt.Fprintf(cmd.OutOrStdout(), "Missing %s (nothing to delete)\n", ref)
			default:
				fmt.Fprintf(cmd.OutOrStdout(), "Deleted %s\nDigest: %s\n", ref, desc.Digest)
			}
			return nil
		},
	}
	rf.registerConnection(cmd.Flags())
	cmd.Flags().BoolVarP(&force, "force", "f", false, "never ask; a reference the registry does not hold is not an error")
	return cmd
}

func descOrNil(d ocispec.Descriptor) *ocispec.Descriptor {
	if d.Digest == "" {
		return nil
	}
	return &d
}
