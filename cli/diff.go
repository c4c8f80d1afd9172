package cli

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/spf13/cobra"
	"oras.land/oras-go/v2/errdef"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/layout"
	"github.com/modelpack/modelpack/artifact/remote"
)

func diffCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	var fromRemote bool
	cmd := &cobra.Command{
		Use:   "diff REF1 REF2",
		Short: "Show which files change from one model to another, and the bytes a node holding the first fetches for the second",
		Long: `Compare two artifacts by file path (the layers' org.cncf.model.filepath annotations; a tar layer is the
directory it was packed from) and by layer digest: the files added, removed and changed, and the blobs of REF2
(config and layers) REF1 lacks, each counted once, which is what a node holding REF1 downloads to serve REF2. A
file moved, or one whose content another file already had, costs nothing.

Each REF is looked up as inspect looks it up: the local store, then, for a name of a registry the store lacks (or
with --remote), the registry. The connection flags are those of pull.`,
		Example: `  modelpack diff registry.local:5000/org/llama3:v1 registry.local:5000/org/llama3:v2
  modelpack diff llama3:v1 llama3:v2 -o json`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var store *layout.Store
			if !fromRemote {
				s, err := layout.Open(g.Home)
				if err != nil {
					return err
				}
				defer s.Close()
				store = s
			}
			var descs [2]ocispec.Descriptor
			var ms [2]ocispec.Manifest
			for i, a := range args {
				d, m, err := diffSide(cmd.Context(), store, a, rf.options())
				if err != nil {
					return err
				}
				descs[i], ms[i] = d, m
			}
			d, err := artifact.DiffManifests(ms[0], ms[1])
			if err != nil {
				return err
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), struct {
					From string `json:"from"`
					To   string `json:"to"`
					*artifact.Diff
				}{args[0] + "@" + descs[0].Digest.String(), args[1] + "@" + descs[1].Digest.String(), d})
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "CHANGE\tPATH\tKIND\tSIZE\tDIGEST")
			row := func(change string, c artifact.FileChange) {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", change, c.Path, orDash(string(c.Kind)), humanBytes(c.Size), shortHex(c.Digest))
			}
			for _, c := range d.Added {
				row("added", c)
			}
			for _, c := range d.Removed {
				row("removed", c)
			}
			for _, c := range d.Changed {
				row("changed", c)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			config := ""
			if d.ConfigChanged {
				config = "; the config changed"
			}
			fmt.Fprintf(out, "%d added, %d removed, %d changed, %d unchanged%s\n", len(d.Added), len(d.Removed), len(d.Changed), d.Unchanged, config)
			fmt.Fprintf(out, "To fetch moving from %s to %s: %s in %d blobs (of %s)\n", args[0], args[1], humanBytes(d.FetchBytes), len(d.Fetch), humanBytes(d.TotalBytes))
			return nil
		},
	}
	rf.registerConnection(cmd.Flags())
	cmd.Flags().BoolVar(&fromRemote, "remote", false, "read both references from their registries even if the local store holds them")
	return cmd
}

// diffSide reads one side's manifest: from the store, unless it lacks a registry name (or store is nil), then from
// the registry.
func diffSide(ctx context.Context, store *layout.Store, ref string, opts remote.Options) (ocispec.Descriptor, ocispec.Manifest, error) {
	if store != nil {
		d, m, err := store.Manifest(ctx, ref)
		if err == nil || !(errors.Is(err, errdef.ErrNotFound) && namesRegistry(ref)) {
			return d, m, err
		}
	}
	r, err := registryRef(ref)
	if err != nil {
		return ocispec.Descriptor{}, ocispec.Manifest{}, asUsage(err)
	}
	repo, _, err := remote.NewRepository(r.String(), opts)
	if err != nil {
		return ocispec.Descriptor{}, ocispec.Manifest{}, err
	}
	return remote.ReadManifest(ctx, repo, r.Reference)
}
