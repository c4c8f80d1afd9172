package cli

import (
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/pack"
	"github.com/modelpack/modelpack/artifact/remote"
)

func fetchCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	var filters, include []string
	var sync bool
	var wf writeFlags
	cmd := &cobra.Command{
		Use:   "fetch REF DIR",
		Short: "Write a model's files from a registry straight into a directory",
		Long: `Write a model's files from a registry straight into DIR, with no copy in the local store.

Every byte is hashed as it arrives. A raw layer is written to a temporary file renamed to its final name only
when its digest matches; a tar layer is extracted aside and moved into place only when its digest matches, so a
corrupt or interrupted download never leaves a partial file under a final name. Dropped connections resume with
HTTP Range. --filter and --include select layers as for unpack.

Files that already exist in DIR are refused before anything is written, unless --force; files already there
byte for byte are skipped. All or nothing: the files are moved into place only once every layer verified, so a
fetch that fails leaves DIR as it was; files that share a digest are downloaded once and copied. What an
interrupted (Ctrl-C) or cut-off fetch downloaded is kept aside in DIR/.modelpack-partial, so a fetch run again
asks the registry only for the bytes it lacks (HTTP Range). A container image is refused
unless --image-rootfs. Files get the modification time the artifact records.`,
		Example: `  modelpack fetch registry.local:5000/org/llama3:8b ./llama3
  modelpack fetch registry.local:5000/org/llama3:8b ./cfg --filter weight.config,doc
  modelpack fetch registry.local:5000/org/llama3:8b ./shard1 --include 'model-00001-*'`,
		Args: cobra.ExactArgs(2),
		ValidArgsFunction: func(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
			if len(args) == 1 {
				return nil, cobra.ShellCompDirectiveFilterDirs
			}
			return nil, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			sel := pack.UnpackOptions{Include: include}
			filtered, err := parseFilters(filters)
			if err != nil {
				return err
			}
			sel.Kinds = filtered
			for _, p := range include {
				if _, err := matchCheck(p); err != nil {
					return err
				}
			}
			ref, err := registryRef(args[0])
			if err != nil {
				return err
			}
			src, _, err := remote.NewRepository(ref.String(), rf.options())
			if err != nil {
				return err
			}
			g.onInterrupt("what arrived is kept in %s; run `modelpack fetch %s %s` again to continue (only the missing bytes are asked for)", filepath.Join(args[1], ".modelpack-partial"), args[0], args[1])
			ui := newTransferUI(cmd, g, "fetched")
			// The layers the kind filter keeps, to say which --include globs keep none of them.
			var kinds []artifact.Layer
			byKind := pack.UnpackOptions{Kinds: sel.Kinds}
			selectFn := func(l artifact.Layer) bool {
				if byKind.Select(l) {
					kinds = append(kinds, l)
				}
				return sel.Select(l)
			}
			check := wf.check(args[0], args[1])
			res, err := remote.Fetch(cmd.Context(), src, args[1], remote.FetchOptions{Reporter: ui.reporter(), Select: wf.skipIdentical(args[1], selectFn), Sync: sync,
				Check: func(ls []artifact.Layer) error {
					if err := wf.unmatched(newWarnings(cmd, g), args[0], include, kinds); err != nil {
						return err
					}
					return check(ls)
				}})
			ui.stop()
			if err != nil {
				return err
			}
			fillArtifactType(cmd.Context(), src, &res.Descriptor)
			return ui.print(transferJSON{Result: res, Dir: args[1]})
		},
	}
	rf.register(cmd.Flags())
	cmd.Flags().StringArrayVar(&filters, "filter", nil, "only layers of these kinds: "+artifact.KindNames()+" (or weights, config, docs; repeatable or comma-separated)")
	cmd.Flags().StringArrayVar(&include, "include", nil, "only layers whose path (or a parent directory) matches this glob: ** spans directories, a glob without / matches at any depth (repeatable)")
	cmd.Flags().BoolVar(&sync, "sync", false, "flush each file to disk before renaming it into place (survives power loss, runs at disk speed)")
	wf.register(cmd)
	_ = cmd.RegisterFlagCompletionFunc("filter", cobra.FixedCompletions(kindNames(), cobra.ShellCompDirectiveNoFileComp))
	return cmd
}
