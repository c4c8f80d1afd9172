package cli

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	humanize "github.com/dustin/go-humanize"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/spf13/cobra"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/hf"
	"github.com/modelpack/modelpack/artifact/layout"
	"github.com/modelpack/modelpack/artifact/pack"
	"github.com/modelpack/modelpack/scan"
)

type packFlags struct {
	tag, modelfile, layerFormat, created string
	datasets, kinds, licenses, authors   []string
	include, exclude                     []string
	ignoreFile                           string
	push, strict, refuseCode, dryRun     bool
	noIgnoreFile                         bool
	concurrency                          int
	desc                                 artifact.ModelDescriptor
	cfg                                  artifact.ModelConfig
}

func packCmd(g *Globals) *cobra.Command {
	f := &packFlags{}
	cmd := &cobra.Command{
		Use:     "pack DIR|FILE|hf://ORG/NAME[@REVISION] -t NAME[:TAG]",
		Aliases: []string{"build"},
		Short:   "Pack a model directory or a Hugging Face model into a ModelPack artifact in the local store",
		Long: `Pack a model directory into a CNCF ModelPack artifact in the local store.

A single FILE (model.gguf, model.safetensors) packs as an artifact of that one file; the files beside it are not read.

Each weight file (safetensors, gguf, bin, pt, onnx, …) becomes a raw layer of its own; config and tokenizer
files become weight.config layers, README/LICENSE/*.md doc layers, *.py and friends code layers. --dataset and
--kind, or a modctl-style Modelfile in DIR, override the classification; a rule that matches a directory packs
it as one tar layer. With --layer-format tar, tar+gzip or tar+zstd, each top-level sub-directory's non-weight
files become one archive; oras pull extracts tar+gzip archives, while tar and tar+zstd ones arrive as DIR.tar /
DIR.tar.zst for tar -xf (oras extracts gzip only). The config is inferred from safetensors/GGUF headers and config.json; flags override.
Hidden files and directories (.git, .cache, …) and the Modelfile are not packed. The same directory always
gives the same digest unless --created is given.

Which files: DIR/.modelpackignore (or --ignore-file PATH; none with --no-ignore-file) leaves out what it names,
with .gitignore's syntax and meaning (patterns relative to DIR, "!" re-includes, "dir/" a directory); then
--include keeps only what it matches and --exclude leaves out what it matches. The flags narrow what the ignore
file leaves; they never bring back a file it ignores. The ignore file itself is never packed.

Before writing, pack prints one summary of the classification on stderr (-o json: "summary"): files and bytes
per kind, and a warning naming every file whose kind its name does not tell, packed as weight.config (or as its
archive's kind); --kind PATTERN=KIND says what it is, --strict fails instead. --kind takes --include's globs
("*.dat" at any depth, "data/**"). --dry-run prints the layers that would be written (path, kind, media type,
bytes) and writes nothing: no blob, no tag, no registry request.

hf://ORG/NAME[@REVISION] packs a model of the Hugging Face Hub (HF_ENDPOINT, default https://huggingface.co;
a private or gated one needs HF_TOKEN or the token file of ` + "`hf auth login`" + `; HF_HUB_DOWNLOAD_TIMEOUT, default
30, the seconds a request may wait for a byte). The revision (default main) is
resolved to its commit; every LFS file is checked against the sha256 the Hub states and every other file against
its git blob id before it enters the artifact. Weights are streamed from the Hub into the store, or with --push
straight into the registry, with no local copy. The config records the source URL, the commit and the card's
license; createdAt is the commit's date, so the same revision always packs to the same digest. A snapshot
directory of a Hub cache (models--ORG--NAME/snapshots/COMMIT) packs as a model directory, its symlinks into the
cache's blobs/ followed.`,
		Example: `  modelpack pack ./llama3-8b -t llama3:8b
  modelpack pack ./qwen2.5-0.5b-q4_k_m.gguf -t qwen2.5:0.5b-q4
  modelpack pack hf://Qwen/Qwen2.5-0.5B-Instruct -t qwen2.5:0.5b --exclude '*.gguf'
  modelpack pack ./model -t registry.local/org/model:v1 --dataset data --layer-format tar+zstd
  modelpack pack ./model -t model:v1 --kind '*.dat=weight' --kind 'eval/**=dataset' --dry-run`,
		Args: cobra.ExactArgs(1),
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.tag, "tag", "t", "", "reference to tag the artifact with, NAME[:TAG] (required)")
	fl.StringVarP(&f.modelfile, "modelfile", "f", "", "modctl-style Modelfile (default DIR/Modelfile if present)")
	fl.StringVar(&f.layerFormat, "layer-format", "raw", "format of non-weight layers: raw, tar, tar+gzip or tar+zstd")
	fl.StringArrayVar(&f.datasets, "dataset", nil, "pack files or directories matching this glob as dataset layers (repeatable)")
	fl.StringArrayVar(&f.kinds, "kind", nil, "PATTERN=KIND: pack files or directories matching the glob (--include's syntax) as KIND ("+artifact.KindNames()+"; repeatable; KIND=PATTERN is read too)")
	fl.StringVar(&f.created, "created", "", "record a creation time (RFC 3339, or \"now\"); without it the artifact has no timestamp")
	fl.IntVar(&f.concurrency, "concurrency", 0, "files packed at once (default GOMAXPROCS; 8 for hf://)")
	fl.StringArrayVar(&f.include, "include", nil, "pack only files matching this glob (repeatable; hf://: huggingface_hub's allow_patterns, where * also matches /; a directory: unpack --include's globs, see docs/usage.md)")
	fl.StringArrayVar(&f.exclude, "exclude", nil, "leave out files matching this glob (repeatable; same dialects as --include)")
	fl.StringVar(&f.ignoreFile, "ignore-file", "", "ignore file, .gitignore syntax, patterns relative to DIR (default DIR/"+pack.IgnoreFileName+" if present); --include/--exclude narrow what it leaves")
	fl.BoolVar(&f.noIgnoreFile, "no-ignore-file", false, "read no ignore file (not DIR/"+pack.IgnoreFileName+")")
	fl.BoolVar(&f.dryRun, "dry-run", false, "print the layers that would be written (path, kind, media type, bytes) and write nothing")
	fl.StringVar(&f.desc.Name, "name", "", "model name (descriptor.name)")
	fl.StringVar(&f.desc.Family, "family", "", "model family, e.g. llama3 (descriptor.family)")
	fl.StringVar(&f.desc.Version, "model-version", "", "model version (descriptor.version)")
	fl.StringVar(&f.desc.Vendor, "vendor", "", "vendor (descriptor.vendor)")
	fl.StringVar(&f.desc.Title, "title", "", "human-readable title (descriptor.title)")
	fl.StringVar(&f.desc.Description, "description", "", "description (descriptor.description)")
	fl.StringVar(&f.desc.SourceURL, "source-url", "", "source URL (descriptor.sourceURL)")
	fl.StringVar(&f.desc.DocURL, "doc-url", "", "documentation URL (descriptor.docURL)")
	fl.StringVar(&f.desc.Revision, "revision", "", "source revision (descriptor.revision)")
	fl.StringArrayVar(&f.licenses, "license", nil, "SPDX license id (descriptor.licenses; repeatable)")
	fl.StringArrayVar(&f.authors, "author", nil, "author (descriptor.authors; repeatable)")
	fl.StringVar(&f.cfg.Architecture, "arch", "", "architecture, e.g. transformer (config.architecture)")
	fl.StringVar(&f.cfg.Format, "format", "", "weight format, e.g. safetensors (config.format)")
	fl.StringVar(&f.cfg.ParamSize, "param-size", "", "parameter count, e.g. 8B or 8030261248 (config.paramSize)")
	fl.StringVar(&f.cfg.Precision, "precision", "", "precision, e.g. bfloat16 (config.precision)")
	fl.StringVar(&f.cfg.Quantization, "quantization", "", "quantization, e.g. awq (config.quantization)")
	_ = cmd.MarkFlagRequired("tag")
	_ = cmd.RegisterFlagCompletionFunc("layer-format", cobra.FixedCompletions([]string{"raw", "tar", "tar+gzip", "tar+zstd"}, cobra.ShellCompDirectiveNoFileComp))
	cmd.MarkFlagsMutuallyExclusive("ignore-file", "no-ignore-file")
	fl.BoolVar(&f.refuseCode, "refuse-code", false, "fail, before packing anything, when a file runs code when loaded or is malformed, as modelpack scan says (default: warn)")
	fl.BoolVar(&f.strict, "strict", false, "fail, before packing anything, when a --kind/--dataset/Modelfile rule or an hf:// --include/--exclude glob matches nothing, or a file's kind is unknown (default: warn)")
	fl.BoolVar(&f.push, "push", false, "push straight to the registry named by --tag instead of the local store")
	pushSink := packPushSink(cmd, g)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return runPack(cmd, g, f, args[0], pushSink)
	}
	return cmd
}

func runPack(cmd *cobra.Command, g *Globals, f *packFlags, dir string, pushSink func(context.Context, string) (pack.Sink, error)) error {
	opts, err := f.options()
	if err != nil {
		return err
	}
	if hf.IsReference(dir) && (f.ignoreFile != "" || f.noIgnoreFile) {
		return usageErr("--ignore-file and --no-ignore-file apply to a local directory; choose a Hub model's files with --include/--exclude")
	}
	var summary *pack.Summary
	ref, err := layout.ParseReference(f.tag)
	if err != nil {
		return asUsage(err)
	}
	opts.Tag = ref
	if hf.IsReference(dir) {
		if _, err := hf.ParseReference(dir); err != nil {
			return asUsage(err) // before the store or the Hub is touched
		}
	}
	ws := newWarnings(cmd, g)
	opts.Warn = ws.add
	var bar *progressBar
	if g.ShowProgress() {
		bar = &progressBar{desc: "packing"}
		opts.Progress = bar
	}
	ctx := cmd.Context()
	var store *layout.Store
	if !f.push && !f.dryRun { // a dry run opens no store: it writes nothing, not even the store's directory
		if store, err = layout.Open(g.Home); err != nil {
			return err
		}
		defer store.Close()
	}
	if hf.IsReference(dir) {
		snap, err := hfSnapshot(ctx, g, f, dir, store)
		if err != nil {
			return err
		}
		defer snap.Close()
		dir = snap.Dir
		for _, g := range snap.Unmatched {
			ws.add(g + " matches no file of " + snap.Ref.String())
		}
		applySnapshot(&opts, snap, f.created == "")
		opts.NoIgnoreFile = true             // the Hub's files are chosen by --include/--exclude
		rules, err := snap.Rules(opts.Rules) // a dataset's files are the dataset kind
		if err != nil {
			return err
		}
		opts.Rules = append(opts.Rules, rules...)
		if f.concurrency == 0 {
			opts.Concurrency = 8 // network-bound: more than GOMAXPROCS files at once
		}
	} else {
		for _, g := range append(slices.Clone(f.include), f.exclude...) {
			if err := artifact.ValidateGlob(g); err != nil {
				return usageErr("%w", err)
			}
		}
		opts.Include, opts.Exclude = f.include, f.exclude
		opts.IgnoreFile, opts.NoIgnoreFile = f.ignoreFile, f.noIgnoreFile
	}
	if err := warnCode(dir, pack.Keeps(dir, opts), f.refuseCode, ws.add); err != nil {
		return err
	}
	if f.dryRun {
		sum, err := pack.Plan(dir, opts)
		if err != nil {
			return err
		}
		printSummary(cmd, g, sum)
		return printPackPlan(cmd, g, opts.Tag, sum, ws.all())
	}
	opts.Summary = func(s *pack.Summary) {
		summary = s
		printSummary(cmd, g, s)
	}
	var sink pack.Sink
	where := "local store"
	if f.push {
		if sink, err = pushSink(ctx, ref); err != nil {
			return err
		}
		where = "registry"
	} else {
		sink = store.Sink()
		if g.ShowLines() && !g.ShowProgress() {
			sink = &packedLines{Sink: store.Sink(), w: cmd.ErrOrStderr()}
		}
	}
	desc, err := pack.Pack(ctx, dir, opts, sink)
	bar.finish()
	if err != nil {
		return err
	}
	if p, ok := sink.(interface {
		printResult(warnings []string, summary *pack.Summary) error
	}); ok {
		return p.printResult(ws.all(), summary) // pack --push: what push prints
	}
	return printPacked(cmd, g, opts.Tag, where, desc, summary, ws.all())
}

// hfSnapshot resolves an hf:// reference and stages the model's small files; the weights must fit in the free
// space of store, if set, less what it holds.
func hfSnapshot(ctx context.Context, g *Globals, f *packFlags, s string, store *layout.Store) (*hf.Snapshot, error) {
	ref, err := hf.ParseReference(s)
	if err != nil {
		return nil, err
	}
	opts := hf.Options{Include: f.include, Exclude: f.exclude, Strict: f.strict}
	if store != nil {
		opts.Dest = store.Root()
		opts.Held = func(d digest.Digest, size int64) bool {
			ok, _ := store.Exists(ctx, ocispec.Descriptor{Digest: d, Size: size})
			return ok
		}
	}
	if hf.Offline() {
		return hf.LocalSnapshot(hf.CacheDir(), ref, opts) // HF_HUB_OFFLINE: huggingface_hub's cache, no request
	}
	client, err := g.hubClient()
	if err != nil {
		return nil, err
	}
	return client.Snapshot(ctx, ref, opts)
}

// applySnapshot puts what the Hub says under what the flags say: a flag that is set wins.
func applySnapshot(opts *pack.Options, snap *hf.Snapshot, created bool) {
	d, flags := snap.Descriptor, opts.Descriptor
	for _, p := range []struct {
		dst *string
		v   string
	}{
		{&d.Name, flags.Name}, {&d.Family, flags.Family}, {&d.Version, flags.Version}, {&d.Vendor, flags.Vendor},
		{&d.Title, flags.Title}, {&d.Description, flags.Description}, {&d.SourceURL, flags.SourceURL},
		{&d.DocURL, flags.DocURL}, {&d.Revision, flags.Revision},
	} {
		if p.v != "" {
			*p.dst = p.v
		}
	}
	if len(flags.Licenses) > 0 {
		d.Licenses = flags.Licenses
	}
	if len(flags.Authors) > 0 {
		d.Authors = flags.Authors
	}
	opts.Descriptor = d
	opts.Remote = snap.Remote
	opts.Annotations = snap.Annotations
	opts.Source = hf.Scheme + snap.Ref.Repo + "@" + snap.Commit
	if created {
		opts.Created = snap.Created
	}
}

func (f *packFlags) options() (pack.Options, error) {
	opts := pack.Options{Modelfile: f.modelfile, Concurrency: f.concurrency, Descriptor: f.desc, Config: f.cfg, Strict: f.strict}
	format, err := artifact.ParseFormat(f.layerFormat)
	if err != nil {
		return opts, usageErr("--layer-format: %w", err)
	}
	opts.LayerFormat = format
	for _, d := range f.datasets {
		r, err := pack.NewRule(artifact.KindDataset, d, "--dataset")
		if err != nil {
			return opts, asUsage(err)
		}
		opts.Rules = append(opts.Rules, r)
	}
	for _, k := range f.kinds {
		r, err := pack.ParseRule(k, "--kind")
		if err != nil {
			return opts, asUsage(err)
		}
		opts.Rules = append(opts.Rules, r)
	}
	if f.cfg.ParamSize != "" {
		if opts.Config.ParamSize, err = pack.ParseParamSize(f.cfg.ParamSize); err != nil {
			return opts, usageErr("--param-size: %w", err)
		}
	}
	opts.Descriptor.Licenses, opts.Descriptor.Authors = f.licenses, f.authors
	// The config schema wants absolute URIs: refuse others here rather than write an invalid config.
	for flag, v := range map[string]string{"--source-url": f.desc.SourceURL, "--doc-url": f.desc.DocURL} {
		if u, err := url.Parse(v); v != "" && (err != nil || !u.IsAbs()) {
			return opts, fmt.Errorf("%s %q: want an absolute URL such as https://example.com/model", flag, v)
		}
	}
	switch f.created {
	case "":
	case "now":
		t := time.Now().UTC()
		opts.Created = &t
	default:
		t, err := time.Parse(time.RFC3339, f.created)
		if err != nil {
			return opts, usageErr("--created %q: want an RFC 3339 time such as 2025-01-02T15:04:05Z, or \"now\"", f.created)
		}
		opts.Created = &t
	}
	return opts, nil
}

func printPacked(cmd *cobra.Command, g *Globals, ref, where string, desc ocispec.Descriptor, summary *pack.Summary, warnings []string) error {
	if g.IsJSON() {
		return PrintJSON(cmd.OutOrStdout(), struct {
			Reference  string             `json:"reference"`
			Descriptor ocispec.Descriptor `json:"descriptor"`
			Summary    *pack.Summary      `json:"summary,omitempty"`
			Warnings   []string           `json:"warnings,omitempty"`
		}{ref, desc, summary, warnings})
	}
	if g.Quiet {
		_, err := fmt.Fprintln(cmd.OutOrStdout(), desc.Digest)
		return err
	}
	_, err := fmt.Fprintf(cmd.OutOrStdout(), "packed %s into the %s: %s\n", ref, where, desc.Digest)
	return err
}

// printSummary says once, on stderr, how the files were classified: files and bytes per kind (-o json carries it
// in the result instead; --quiet says nothing).
func printSummary(cmd *cobra.Command, g *Globals, s *pack.Summary) {
	if g.IsJSON() || g.Quiet {
		return
	}
	parts := make([]string, len(s.Kinds))
	files := 0
	for i, k := range s.Kinds {
		parts[i] = fmt.Sprintf("%s %d (%s)", k.Kind, k.Files, humanBytes(k.Bytes))
		files += k.Files
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "classified %d files into %d layers: %s\n", files, len(s.Layers), strings.Join(parts, ", "))
}

// printPackPlan prints what pack --dry-run would write: one line per layer, or the plan as JSON.
func printPackPlan(cmd *cobra.Command, g *Globals, ref string, s *pack.Summary, warnings []string) error {
	if g.IsJSON() {
		return PrintJSON(cmd.OutOrStdout(), struct {
			Reference string        `json:"reference"`
			DryRun    bool          `json:"dryRun"`
			Summary   *pack.Summary `json:"summary"`
			Warnings  []string      `json:"warnings,omitempty"`
		}{ref, true, s, warnings})
	}
	w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "LAYER\tKIND\tFILES\tBYTES\tMEDIA TYPE\tDIGEST")
	for _, l := range s.Layers {
		d := "-"
		if l.Digest != "" {
			d = l.Digest.String()
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\n", l.Path, l.Kind, l.Files, humanBytes(l.Bytes), l.MediaType, d)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(cmd.OutOrStdout(), "dry run: %d layers and a config would be packed as %s; nothing was written\n", len(s.Layers), ref)
	return err
}

// humanBytes writes a size in binary units (1.5 GiB).
func humanBytes(n int64) string { return humanize.IBytes(uint64(max(n, 0))) }

// packedLines prints a line per blob stored ("packed  FILE  SIZE") when stderr is no terminal, where the bar is
// not drawn: a piped pack (CI) shows what it did, as push and pull do.
type packedLines struct {
	*layout.Sink
	w  io.Writer
	mu sync.Mutex
}

func (s *packedLines) AddBlob(ctx context.Context, desc ocispec.Descriptor, open func() (io.ReadCloser, error)) (ocispec.Descriptor, error) {
	d, err := s.Sink.AddBlob(ctx, desc, open)
	if err == nil {
		named := d
		if named.Annotations == nil {
			named.Annotations = desc.Annotations
		}
		s.mu.Lock()
		fmt.Fprintf(s.w, "%-8s %s  %s\n", "packed", blobLabel(named), humanBytes(d.Size))
		s.mu.Unlock()
	}
	return d, err
}

// warnCode scans what pack is about to read (for hf://, the files it staged; the weights it streams are scanned
// by modelpack scan hf://…): a file whose loading runs code, or that the scanner cannot vouch for, is a warning,
// or with refuse the error that stops the pack before anything is written.
func warnCode(dir string, keeps func(rel string) bool, refuse bool, warn func(string)) error {
	reps, err := scan.Dir(dir)
	if err != nil {
		return nil // what cannot be read is pack's to report, in its words
	}
	// The files the ignore file or --include/--exclude leave out are not packed, so not warned of.
	reps = slices.DeleteFunc(reps, func(r scan.FileReport) bool { return !keeps(r.Path) })
	return codeFindings(reps, refuse, warn)
}

// codeFindings warns of (or with refuse, fails on) each report whose file runs code when loaded or is malformed.
func codeFindings(reps []scan.FileReport, refuse bool, warn func(string)) error {
	var bad []string
	for _, r := range reps {
		if r.Verdict == scan.Data || strings.HasPrefix(r.Path, ".") || strings.Contains(r.Path, "/.") {
			continue // hidden files are not packed
		}
		what := r.Reason
		if c := r.FirstCallable(); c != "" {
			what = "imports " + c
		}
		bad = append(bad, fmt.Sprintf("%s is %s (%s): %s", r.Path, r.Verdict, r.Format, what))
	}
	if refuse && len(bad) > 0 {
		return fmt.Errorf("--refuse-code: %s", strings.Join(bad, "; "))
	}
	for _, b := range bad {
		warn(b + "; loading it runs code or cannot be vouched for (modelpack scan; --refuse-code fails)")
	}
	return nil
}
