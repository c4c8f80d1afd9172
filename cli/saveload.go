package cli

import (
	"errors"
	"fmt"
	"strings"

	digest "github.com/opencontainers/go-digest"
	"github.com/spf13/cobra"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry"

	"github.com/modelpack/modelpack/artifact/layout"
	"github.com/modelpack/modelpack/artifact/ocitar"
	"github.com/modelpack/modelpack/artifact/remote"
)

func saveCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	var out string
	var referrers bool
	cmd := &cobra.Command{
		Use:   "save REF -o FILE",
		Short: "Write an artifact, and with -r its signatures and other referrers, to an OCI image layout tar",
		Long: `Write the artifact REF names to FILE as an OCI image layout in a tar (oci-layout, index.json,
blobs/sha256/…), for clusters without a registry: carry it over and run modelpack load. REF is looked up as inspect
looks it up: the local store, then the registry for a registry name the store lacks. Blobs stream into the tar as
they arrive (no staging copy), each checked against its digest; FILE appears only once complete ("-" writes to
stdout). index.json names the artifact by its tag (org.opencontainers.image.ref.name, what oras --oci-layout
DIR:TAG reads) and by its full reference (io.containerd.image.name, what load reads back). Extracted, the layout is
read by oras (--oci-layout), crane (push DIR) and skopeo (oci:DIR). -r adds the referrers (signatures, SBOMs,
attachments) and cosign's sha256-<hex>.sig/.att/.sbom tags.

-o here is the file, not the output format (as docker save's).`,
		Example: `  modelpack save registry.local:5000/org/llama3:8b -r -o llama3.tar
  modelpack save llama3:8b -o - | ssh airgap 'cat > llama3.tar'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return asUsage(errors.New("-o FILE is required (\"-\" for stdout)"))
			}
			ref := args[0]
			store, err := layout.Open(g.Home)
			if err != nil {
				return err
			}
			defer store.Close()
			full, tag, err := archiveNames(ref)
			if err != nil {
				return asUsage(err)
			}
			root, err := store.Resolve(cmd.Context(), ref)
			local := err == nil
			if err != nil && !(errors.Is(err, errdef.ErrNotFound) && namesRegistry(ref)) {
				return err
			}
			var repo *remote.Repository
			if !local {
				r, err := registryRef(ref)
				if err != nil {
					return asUsage(err)
				}
				if repo, _, err = remote.NewRepository(r.String(), rf.options()); err != nil {
					return err
				}
			}
			ui := newTransferUI(cmd, g, "saved")
			var res *remote.Result
			err = ocitar.Save(out, func(w *ocitar.Writer) error {
				if local {
					if _, err := ocitar.Copy(cmd.Context(), store, root.Digest.String(), w, tag, referrers); err != nil {
						return err
					}
					res = &remote.Result{Reference: ref, Descriptor: root}
				} else {
					r, err := remote.Pull(cmd.Context(), repo, w, tag, remote.TransferOptions{Concurrency: 1, Referrers: referrers, Reporter: ui.reporter()})
					if err != nil {
						return err
					}
					res, root = r, r.Descriptor
				}
				if full != "" {
					w.Name(root.Digest, full)
				}
				return nil
			})
			ui.stop()
			if err != nil {
				return err
			}
			if g.Quiet || out == "-" {
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Saved %s to %s\nDigest: %s\n", ref, out, res.Descriptor.Digest)
			return nil
		},
	}
	rf.register(cmd.Flags())
	cmd.Flags().StringVarP(&out, "output", "o", "", "the tar file to write (\"-\": stdout)")
	cmd.Flags().BoolVarP(&referrers, "referrers", "r", false, "also save the artifacts referring to it (signatures, SBOMs) and cosign's tags")
	return cmd
}

// archiveNames are the names save gives REF in index.json: its full reference and its tag (empty for a digest).
func archiveNames(ref string) (full, tag string, err error) {
	canonical, err := layout.ParseReference(ref)
	if err != nil {
		return "", "", err
	}
	if _, err := digest.Parse(ref); err == nil {
		return "", "", nil // a bare digest of the store names nothing
	}
	parse := canonical
	if !namesRegistry(canonical) {
		parse = "localhost/" + canonical
	}
	r, err := registry.ParseReference(parse)
	if err != nil {
		return "", "", err
	}
	if r.ValidateReferenceAsDigest() == nil {
		return canonical, "", nil
	}
	return canonical, r.Reference, nil
}

func loadCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	var tag string
	cmd := &cobra.Command{
		Use:   "load FILE [REGISTRY/REPOSITORY[:TAG]]",
		Short: "Read an OCI image layout tar (modelpack save's) into the local store, or push it to a registry",
		Long: `Read the artifact FILE holds, with the referrers saved beside it, into the local store under the name save
recorded (io.containerd.image.name; --tag gives another) or, with a registry reference, push it there (its tag,
or the archive's). The tar is checked before anything is copied: every entry must be a file of the layout (no
path leaving it, no link, no name twice), every blob must hash to its name and every blob a manifest names must be
there. The name is given last, so a load that fails tags nothing.`,
		Example: `  modelpack load llama3.tar
  modelpack load llama3.tar --tag llama3:8b
  modelpack load llama3.tar registry.airgap:5000/org/llama3:8b`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if len(args) == 2 && tag != "" {
				return asUsage(errors.New("--tag names the artifact in the local store; with a registry reference, put the tag in it"))
			}
			a, err := ocitar.Open(ctx, args[0])
			if err != nil {
				return err
			}
			root, err := a.Root()
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			if len(args) == 2 {
				dstRef := args[1]
				r, err := registryRepo(dstRef)
				if err != nil {
					return asUsage(err)
				}
				if r.Reference == "" {
					if root.Tag == "" || strings.HasPrefix(root.Tag, "sha256:") {
						return asUsage(fmt.Errorf("%s names no tag: give one in %s:TAG", args[0], dstRef))
					}
					r.Reference = root.Tag
				}
				dst, _, err := remote.NewRepository(r.String(), rf.options())
				if err != nil {
					return err
				}
				ui := newTransferUI(cmd, g, "loaded")
				res, err := remote.Push(ctx, a.Store, root.Digest.String(), dst, remote.TransferOptions{Referrers: true, Reporter: ui.reporter()})
				return ui.done(res, err)
			}
			name := tag
			if name == "" {
				name = root.Name
			}
			if name == "" {
				return asUsage(fmt.Errorf("%s does not record the artifact's name (only the tag %q): give --tag NAME:TAG", args[0], root.Tag))
			}
			name, err = layout.ParseReference(name)
			if err != nil {
				return asUsage(err)
			}
			store, err := layout.Open(g.Home)
			if err != nil {
				return err
			}
			defer store.Close()
			if _, err := ocitar.Copy(ctx, a.Store, root.Digest.String(), store, name, true); err != nil {
				return err
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), struct {
					Reference string `json:"reference"`
					Digest    string `json:"digest"`
				}{name, root.Digest.String()})
			}
			if !g.Quiet {
				fmt.Fprintf(cmd.OutOrStdout(), "Loaded %s\nDigest: %s\n", name, root.Digest)
			}
			return nil
		},
	}
	rf.register(cmd.Flags())
	cmd.Flags().StringVarP(&tag, "tag", "t", "", "the name to give it in the local store (default: the name save recorded)")
	return cmd
}
