package cli

import (
	"fmt"
	"io"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/spf13/cobra"

	"github.com/modelpack/modelpack/artifact/remote"
)

func attachCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	var artifactType string
	var annotations []string
	cmd := &cobra.Command{
		Use:   "attach REF FILE...",
		Short: "Attach files to an artifact in a registry as a referrer (an SBOM, a model card, evaluation results)",
		Long: `Attach files to the artifact REF names as a new artifact whose subject is REF's digest, as oras attach
does: an OCI 1.1 manifest of --artifact-type with each FILE a layer titled with its base name. Registries without
the referrers API get the referrers tag (sha256-<hex>) oras-go and oras keep, so discover finds it either way.
The connection flags are those of pull.`,
		Example: `  modelpack attach registry.local:5000/org/llama3:8b --artifact-type application/spdx+json sbom.spdx.json
  modelpack attach registry.local:5000/org/llama3:8b --artifact-type application/vnd.example.eval+json \
      --annotation org.example.suite=mmlu results.json`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, err := registryRef(args[0])
			if err != nil {
				return asUsage(err)
			}
			ann, err := parseAnnotations(annotations)
			if err != nil {
				return asUsage(err)
			}
			if artifactType == "" {
				return asUsage(fmt.Errorf("--artifact-type is required (e.g. application/spdx+json)"))
			}
			repo, _, err := remote.NewRepository(ref.String(), rf.options())
			if err != nil {
				return err
			}
			ui := newTransferUI(cmd, g, "attached")
			res, err := remote.Attach(cmd.Context(), repo, remote.AttachOptions{ArtifactType: artifactType, Files: args[1:], Annotations: ann, Reporter: ui.reporter()})
			return ui.done(res, err)
		},
	}
	rf.registerConnection(cmd.Flags())
	cmd.Flags().StringVar(&artifactType, "artifact-type", "", "the referrer's artifact type (required)")
	cmd.Flags().StringArrayVarP(&annotations, "annotation", "a", nil, "manifest annotation KEY=VALUE (repeatable)")
	return cmd
}

// parseAnnotations reads KEY=VALUE pairs.
func parseAnnotations(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--annotation %q: write KEY=VALUE", kv)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("--annotation %q: %s given twice", kv, k)
		}
		out[k] = v
	}
	return out, nil
}

func discoverCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	var artifactType string
	cmd := &cobra.Command{
		Use:   "discover REF",
		Short: "List the artifacts referring to an artifact in a registry (signatures, SBOMs, attachments)",
		Long: `List the referrers of the artifact REF names, as a tree (the referrers of each referrer below it), as oras
discover does; -o json prints the tree as JSON. --artifact-type keeps the direct referrers of that type. The
referrers API is used where the registry has it, the referrers tag (sha256-<hex>) otherwise. The connection flags
are those of pull.`,
		Example: `  modelpack discover registry.local:5000/org/llama3:8b
  modelpack discover registry.local:5000/org/llama3:8b --artifact-type application/spdx+json -o json`,
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
			root, err := repo.Resolve(cmd.Context(), ref.Reference)
			if err != nil {
				return err
			}
			tree, err := remote.ListReferrers(cmd.Context(), repo, root, artifactType)
			if err != nil {
				return err
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), struct {
					Reference string `json:"reference"`
					ocispec.Descriptor
					Referrers []remote.Referrer `json:"referrers"`
				}{ref.String(), root, tree})
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "%s@%s\n", repo, root.Digest)
			printReferrers(out, tree, "")
			return nil
		},
	}
	rf.registerConnection(cmd.Flags())
	cmd.Flags().StringVar(&artifactType, "artifact-type", "", "list only the direct referrers of this artifact type")
	return cmd
}

// printReferrers draws the tree as oras discover does: artifact type, then digest, below each its referrers.
func printReferrers(out io.Writer, rs []remote.Referrer, indent string) {
	for i, r := range rs {
		branch, next := "├── ", "│   "
		if i == len(rs)-1 {
			branch, next = "└── ", "    "
		}
		at := r.ArtifactType
		if at == "" {
			at = "(no artifact type)"
		}
		fmt.Fprintf(out, "%s%s%s\n", indent, branch, at)
		fmt.Fprintf(out, "%s%s└── %s\n", indent, next, r.Digest)
		printReferrers(out, r.Referrers, indent+next+"    ")
	}
}
