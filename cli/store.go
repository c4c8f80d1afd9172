package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/layout"
	"github.com/modelpack/modelpack/artifact/pack"
	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/cas"
)

// completeRefThenDir completes REF DIR: a stored reference, then a directory.
func completeRefThenDir(g *Globals) cobra.CompletionFunc {
	refs := completeRefs(g, 1)
	return func(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
		if len(args) == 1 {
			return nil, cobra.ShellCompDirectiveFilterDirs
		}
		return refs(cmd, args, prefix)
	}
}

// completeRefs completes references held in the local store.
func completeRefs(g *Globals, max int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if max >= 0 && len(args) >= max {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		store, err := layout.Open(g.Home)
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		entries, err := store.List()
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		refs := make([]string, len(entries))
		for i, e := range entries {
			refs[i] = e.Reference
		}
		return refs, cobra.ShellCompDirectiveNoFileComp
	}
}

// artifactInfo is a stored artifact as list and inspect show it.
type artifactInfo struct {
	Reference  string             `json:"reference,omitempty"`
	Descriptor ocispec.Descriptor `json:"descriptor"`
	Size       int64              `json:"size"`
	Manifest   *ocispec.Manifest  `json:"manifest,omitempty"`
	Config     json.RawMessage    `json:"config,omitempty"`
	Model      *artifact.Model    `json:"-"`
	Layers     []artifact.Layer   `json:"-"`
}

// loadArtifact reads a stored manifest and, for a model, its config.
func loadArtifact(ctx context.Context, store *layout.Store, ref string) (*artifactInfo, error) {
	desc, m, err := store.Manifest(ctx, ref)
	if err != nil {
		if artifact.IsIndex(desc.MediaType) {
			return &artifactInfo{Reference: ref, Descriptor: desc, Size: desc.Size}, nil // an index: no layers to show
		}
		return nil, err
	}
	return describeManifest(ctx, store, ref, desc, m), nil
}

// describeManifest is what list and inspect show of a manifest whose blobs src holds.
func describeManifest(ctx context.Context, src content.Fetcher, ref string, desc ocispec.Descriptor, m ocispec.Manifest) *artifactInfo {
	info := &artifactInfo{Reference: ref, Descriptor: withArtifactType(desc, &m), Manifest: &m, Size: desc.Size + m.Config.Size}
	for _, l := range m.Layers {
		info.Size += l.Size
	}
	if artifact.CheckSize("config", m.Config) == nil {
		if cb, err := content.FetchAll(ctx, src, m.Config); err == nil && json.Valid(cb) {
			info.Config = cb
			if artifact.IsModelManifest(m.ArtifactType, m.Config.MediaType) {
				var model artifact.Model
				if json.Unmarshal(cb, &model) == nil {
					info.Model = &model
				}
			}
		}
	}
	info.Layers, _ = artifact.Layers(m)
	return info
}

// loadRemoteArtifact reads a manifest and its config from a registry.
func loadRemoteArtifact(ctx context.Context, ref registry.Reference, opts remote.Options) (*artifactInfo, error) {
	repo, _, err := remote.NewRepository(ref.String(), opts)
	if err != nil {
		return nil, err
	}
	desc, rc, err := repo.FetchReference(ctx, ref.Reference)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := cas.ReadAll(rc, desc.Digest, desc.Size)
	if err != nil {
		return nil, fmt.Errorf("manifest of %s: %w", ref, err)
	}
	if artifact.IsIndex(desc.MediaType) {
		return &artifactInfo{Reference: ref.String(), Descriptor: desc, Size: desc.Size}, nil
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("manifest of %s: %w", ref, err)
	}
	return describeManifest(ctx, repo, ref.String(), desc, m), nil
}

func listCmd(g *Globals) *cobra.Command {
	return &cobra.Command{
		Use: "list",
		Example: `  modelpack list
  modelpack list -o json`,
		Aliases: []string{"ls"},
		Short:   "List the artifacts in the local store",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			store, err := layout.Open(g.Home)
			if err != nil {
				return err
			}
			defer store.Close()
			entries, err := store.List()
			if err != nil {
				return err
			}
			infos := []*artifactInfo{}
			for _, e := range entries {
				info, err := loadArtifact(cmd.Context(), store, e.Reference)
				if err != nil {
					return fmt.Errorf("%s: %w", e.Reference, err)
				}
				infos = append(infos, info)
			}
			if g.IsJSON() {
				for _, i := range infos {
					i.Manifest, i.Config = nil, nil
				}
				return PrintJSON(cmd.OutOrStdout(), infos)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "REFERENCE\tDIGEST\tSIZE\tFAMILY\tPARAMS\tFORMAT\tCREATED")
			for _, i := range infos {
				family, params, format, created := "-", "-", "-", "-"
				if m := i.Model; m != nil {
					family, params, format = orDash(m.Descriptor.Family), orDash(m.Config.ParamSize), orDash(m.Config.Format)
					if m.Descriptor.CreatedAt != nil {
						created = m.Descriptor.CreatedAt.Format("2006-01-02 15:04")
					}
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", i.Reference, shortDigest(i.Descriptor), humanBytes(i.Size), family, params, format, created)
			}
			return w.Flush()
		},
	}
}

func inspectCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	var fromRemote bool
	cmd := &cobra.Command{
		Use:   "inspect REF",
		Short: "Show an artifact's manifest, config and layers, from the local store or a registry",
		Long: `Show an artifact's manifest, config and layers. REF is looked up in the local store; a REF that names a
registry (REGISTRY/REPOSITORY:TAG) and is not in the store is read from the registry, with no copy kept, as is any
REF with --remote. The connection flags are those of pull.`,
		Example: `  modelpack inspect llama3:8b
  modelpack inspect registry.local:5000/org/llama3:8b --remote
  modelpack inspect --plain-http 127.0.0.1:5000/org/llama3:8b -o json`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeRefs(g, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var info *artifactInfo
			if !fromRemote {
				store, err := layout.Open(g.Home)
				if err != nil {
					return err
				}
				defer store.Close()
				info, err = loadArtifact(cmd.Context(), store, args[0])
				if err != nil && !(errors.Is(err, errdef.ErrNotFound) && namesRegistry(args[0])) {
					return err
				}
			}
			if info == nil {
				ref, err := registryRef(args[0])
				if err != nil {
					return err
				}
				if info, err = loadRemoteArtifact(cmd.Context(), ref, rf.options()); err != nil {
					return err
				}
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), info)
			}
			return printInspect(cmd.OutOrStdout(), info)
		},
	}
	rf.registerConnection(cmd.Flags())
	cmd.Flags().BoolVar(&fromRemote, "remote", false, "read REF from its registry even if the local store holds it")
	return cmd
}

func printInspect(out io.Writer, info *artifactInfo) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "Reference:\t%s\n", info.Reference)
	fmt.Fprintf(w, "Digest:\t%s\n", info.Descriptor.Digest)
	fmt.Fprintf(w, "Media type:\t%s\n", info.Descriptor.MediaType)
	if m := info.Manifest; m != nil {
		fmt.Fprintf(w, "Artifact type:\t%s\n", orDash(info.Descriptor.ArtifactType))
		if isImageConfig(info.Descriptor.ArtifactType) {
			fmt.Fprintf(w, "Kind:\t%s\n", "container image (unpack and fetch need --image-rootfs to write its root filesystem)")
		}
	}
	fmt.Fprintf(w, "Size:\t%s\n", humanBytes(info.Size))
	if m := info.Model; m != nil {
		d, c := m.Descriptor, m.Config
		for _, kv := range [][2]string{
			{"Name", d.Name}, {"Family", d.Family}, {"Version", d.Version}, {"Architecture", c.Architecture},
			{"Format", c.Format}, {"Parameters", c.ParamSize}, {"Precision", c.Precision}, {"Quantization", c.Quantization},
			{"Licenses", strings.Join(d.Licenses, ", ")},
		} {
			if kv[1] != "" {
				fmt.Fprintf(w, "%s:\t%s\n", kv[0], kv[1])
			}
		}
		if d.CreatedAt != nil {
			fmt.Fprintf(w, "Created:\t%s\n", d.CreatedAt.Format("2006-01-02T15:04:05Z07:00"))
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if info.Manifest == nil {
		return nil
	}
	fmt.Fprintln(out)
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "KIND\tFORMAT\tSIZE\tDIGEST\tPATH")
	if len(info.Layers) == len(info.Manifest.Layers) {
		for _, l := range info.Layers {
			kind := string(l.Kind)
			if l.Image {
				kind = "image"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", kind, l.Format, humanBytes(l.Size), shortDigest(l.Descriptor), orDash(l.Path))
		}
	} else {
		for _, l := range info.Manifest.Layers {
			fmt.Fprintf(w, "%s\t-\t%s\t%s\t%s\n", l.MediaType, humanBytes(l.Size), shortDigest(l), orDash(artifact.LayerFilepath(l.Annotations)))
		}
	}
	return w.Flush()
}

func unpackCmd(g *Globals) *cobra.Command {
	var filters, include []string
	var wf writeFlags
	cmd := &cobra.Command{
		Use:   "unpack REF DIR",
		Short: "Write an artifact's files into a directory",
		Long: `Write an artifact's files into DIR: raw layers as files, tar layers extracted. Every blob is verified
against its digest as it is written, and layer paths that would land outside DIR are refused. Files that already
exist in DIR are refused before anything is written, unless --force; files already there byte for byte are
skipped. All or nothing: the files are moved into place only once every layer verified, so an unpack that fails
leaves DIR as it was; files that share a digest are written once and copied. A container image is refused unless --image-rootfs. Files get the modification time the artifact
records (the epoch for a reproducible pack), as fetch gives them.`,
		Example: `  modelpack unpack llama3:8b ./llama3
  modelpack unpack llama3:8b ./cfg --filter weight.config --filter doc
  modelpack unpack llama3:8b ./shard --include 'model-00001-*'`,
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: completeRefThenDir(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := pack.UnpackOptions{Include: include, Force: wf.force}
			filtered, err := parseFilters(filters)
			if err != nil {
				return err
			}
			opts.Kinds = filtered
			for _, p := range include {
				if _, err := matchCheck(p); err != nil {
					return err
				}
			}
			store, err := layout.Open(g.Home)
			if err != nil {
				return err
			}
			defer store.Close()
			info, err := loadArtifact(cmd.Context(), store, args[0])
			if errors.Is(err, errdef.ErrNotFound) && namesRegistry(args[0]) {
				// unpack reads the local store only: say where a registry's model comes from.
				return fmt.Errorf("%s is not in the local store (%s), which unpack reads: `modelpack pull %s` stores it first, or `modelpack fetch %s %s` writes its files straight from the registry",
					args[0], g.Home, args[0], args[0], args[1])
			}
			if err != nil {
				return err
			}
			if info.Manifest == nil {
				return fmt.Errorf("%s is a %s, not a manifest", args[0], info.Descriptor.MediaType)
			}
			var selected, kinds []artifact.Layer
			byKind := pack.UnpackOptions{Kinds: opts.Kinds}
			for _, l := range info.Layers {
				if opts.Select(l) {
					selected = append(selected, l)
				}
				if byKind.Select(l) {
					kinds = append(kinds, l)
				}
			}
			if err := wf.unmatched(newWarnings(cmd, g), args[0], include, kinds); err != nil {
				return err
			}
			// Existing paths are checked by pack.Unpack, which skips the files already there byte for byte first.
			if err := wf.checkImage(args[0], args[1], selected); err != nil {
				return err
			}
			if err := checkSpace(args[1], selected); err != nil {
				return err
			}
			var bar *progressBar
			if g.ShowProgress() {
				bar = &progressBar{desc: "unpacking"}
				opts.Progress = bar
			}
			files, err := pack.Unpack(cmd.Context(), store, *info.Manifest, args[1], opts)
			bar.finish()
			if err != nil {
				return err
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), filesResult{Reference: args[0], Descriptor: withArtifactType(info.Descriptor, info.Manifest), Dir: args[1], Files: files})
			}
			if !g.Quiet {
				fmt.Fprintf(cmd.OutOrStdout(), "unpacked %s into %s\n", args[0], args[1])
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&filters, "filter", nil, "only layers of these kinds: "+artifact.KindNames()+" (or weights, config, docs; repeatable or comma-separated)")
	cmd.Flags().StringArrayVar(&include, "include", nil, "only layers whose path (or a parent directory) matches this glob: ** spans directories, a glob without / matches at any depth (repeatable)")
	_ = cmd.RegisterFlagCompletionFunc("filter", cobra.FixedCompletions(kindNames(), cobra.ShellCompDirectiveNoFileComp))
	wf.register(cmd)
	return cmd
}

// filesResult is what unpack and fetch print with -o json: the artifact and the files written into dir.
type filesResult struct {
	Reference  string             `json:"reference"`
	Descriptor ocispec.Descriptor `json:"descriptor"`
	Dir        string             `json:"dir"`
	Files      []string           `json:"files"`
}

// withArtifactType fills the descriptor's artifactType from its manifest, as OCI 1.1 descriptors carry it.
func withArtifactType(d ocispec.Descriptor, m *ocispec.Manifest) ocispec.Descriptor {
	if m != nil && d.ArtifactType == "" {
		d.ArtifactType = m.ArtifactType
		if d.ArtifactType == "" {
			d.ArtifactType = m.Config.MediaType
		}
	}
	return d
}

func matchCheck(p string) (bool, error) {
	if _, err := path.Match(p, ""); err != nil {
		return false, usageErr("--include %q: %w", p, err)
	}
	return true, nil
}

func tagCmd(g *Globals) *cobra.Command {
	return &cobra.Command{
		Use:               "tag SOURCE TARGET",
		Example:           `  modelpack tag llama3:8b registry.local:5000/org/llama3:8b`,
		Short:             "Give a stored artifact another reference",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: completeRefs(g, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			target, err := layout.ParseReference(args[1])
			if err != nil {
				return err
			}
			store, err := layout.Open(g.Home)
			if err != nil {
				return err
			}
			defer store.Close()
			desc, err := store.Resolve(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if err := store.Tag(cmd.Context(), desc, target); err != nil {
				return err
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), layout.Entry{Reference: target, Descriptor: desc})
			}
			if !g.Quiet {
				fmt.Fprintf(cmd.OutOrStdout(), "tagged %s as %s\n", desc.Digest, target)
			}
			return nil
		},
	}
}

func rmCmd(g *Globals) *cobra.Command {
	var prune bool
	cmd := &cobra.Command{
		Use: "rm REF...",
		Example: `  modelpack rm llama3:8b
  modelpack rm --prune llama3:8b llama3:70b`,
		Aliases:           []string{"remove"},
		Short:             "Remove references from the local store (content goes with prune)",
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: completeRefs(g, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			store, err := layout.Open(g.Home)
			if err != nil {
				return err
			}
			defer store.Close()
			removed := []string{}
			for _, a := range args {
				ref, err := store.Name(a)
				if err != nil {
					return err
				}
				if err := store.Untag(cmd.Context(), ref); err != nil {
					return err
				}
				removed = append(removed, ref)
				if !g.IsJSON() && !g.Quiet {
					fmt.Fprintf(cmd.OutOrStdout(), "removed %s\n", ref)
				}
			}
			var stats *layout.PruneStats
			if prune {
				s, err := store.Prune(cmd.Context())
				if err != nil {
					return err
				}
				stats = &s
				if !g.IsJSON() && !g.Quiet {
					fmt.Fprintf(cmd.OutOrStdout(), "pruned %d blobs, %s\n", s.Blobs, humanBytes(s.Bytes))
				}
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), struct {
					Removed []string           `json:"removed"`
					Pruned  *layout.PruneStats `json:"pruned,omitempty"`
				}{removed, stats})
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&prune, "prune", false, "also delete blobs no reference reaches any more")
	return cmd
}

func pruneCmd(g *Globals) *cobra.Command {
	return &cobra.Command{
		Use:     "prune",
		Example: `  modelpack prune -o json`,
		Short:   "Delete blobs that no reference in the local store reaches",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			store, err := layout.Open(g.Home)
			if err != nil {
				return err
			}
			defer store.Close()
			s, err := store.Prune(cmd.Context())
			if err != nil {
				return err
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), s)
			}
			if !g.Quiet {
				fmt.Fprintf(cmd.OutOrStdout(), "pruned %d blobs, %s\n", s.Blobs, humanBytes(s.Bytes))
			}
			return nil
		},
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func shortDigest(d ocispec.Descriptor) string {
	s := d.Digest.String()
	if _, hex, ok := strings.Cut(s, ":"); ok && len(hex) > 12 {
		return hex[:12]
	}
	return s
}

// progressBar shows pack and unpack progress on a TTY; a nil *progressBar does nothing.
type progressBar struct {
	desc string
	once sync.Once
	bar  *progressbar.ProgressBar
}

func (p *progressBar) Start(total int64) {
	p.once.Do(func() { p.bar = newBytesBar(os.Stderr, total, p.desc) })
}

// newBytesBar is progressbar.DefaultBytes in binary units (MiB, GiB), as every other size modelpack prints.
func newBytesBar(w io.Writer, total int64, desc string) *progressbar.ProgressBar {
	// Full width only where the terminal says how wide it is: a pty without a size would get an empty "||".
	width := progressbar.OptionFullWidth()
	if termWidth() < 40 {
		width = progressbar.OptionSetWidth(20)
	}
	return progressbar.NewOptions64(total,
		progressbar.OptionSetDescription(desc),
		progressbar.OptionSetWriter(w),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowTotalBytes(true),
		progressbar.OptionUseIECUnits(true),
		progressbar.OptionSetWidth(10),
		progressbar.OptionThrottle(65*time.Millisecond),
		progressbar.OptionShowCount(),
		progressbar.OptionOnCompletion(func() { fmt.Fprint(w, "\n") }),
		progressbar.OptionSpinnerType(14),
		width,
		progressbar.OptionSetRenderBlankState(true),
	)
}

func (p *progressBar) Add(n int64) {
	if p.bar != nil {
		p.bar.Add64(n)
	}
}

func (p *progressBar) finish() {
	if p != nil && p.bar != nil {
		p.bar.Finish()
	}
}

// parseFilters reads --filter values (repeated or comma-separated) as layer kinds, the spec's names or an alias.
func parseFilters(filters []string) ([]artifact.Kind, error) {
	var kinds []artifact.Kind
	for _, f := range filters {
		for _, v := range strings.Split(f, ",") {
			k, err := artifact.ParseKind(v)
			if err != nil {
				return nil, usageErr("--filter: %v", err)
			}
			kinds = append(kinds, k)
		}
	}
	return kinds, nil
}

// kindNames are the spec's kind names, for completion.
func kindNames() []string {
	names := make([]string, len(artifact.Kinds))
	for i, k := range artifact.Kinds {
		names[i] = string(k)
	}
	return names
}
