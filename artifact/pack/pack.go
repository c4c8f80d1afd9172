// Package pack turns a model directory into a CNCF ModelPack artifact.
//
// Weight files become raw layers of their own, read once: the sink hashes and stores each file in the same pass, in
// parallel across files, so memory does not grow with the model. Other files become raw layers or reproducible tar
// archives (tar, tar+gzip, tar+zstd). The config is inferred from the files (safetensors and GGUF headers,
// config.json) and overridden by a Modelfile and then by options. The same input gives the same manifest digest:
// nothing depends on timestamps, owners, walk order or the machine, unless Options.Created asks for a date.
package pack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/schema"
	"github.com/modelpack/modelpack/internal/beneath"
)

// Sink receives packed blobs. The local store's sink hashes and writes in one pass (cas.Write);
// the transport engineer writes a registry sink for `pack --push` that calls open twice (hash, then upload).
type Sink interface {
	// AddBlob stores the bytes open returns and returns desc with their digest and size. desc says what the blob is
	// before it is read: its media type and, for a layer, the file it holds (org.opencontainers.image.title), so
	// that a sink reporting progress can name it. open may be called more than once.
	AddBlob(ctx context.Context, desc ocispec.Descriptor, open func() (io.ReadCloser, error)) (ocispec.Descriptor, error)
	// Commit stores the manifest and, only after everything is durable, tags it.
	Commit(ctx context.Context, manifest ocispec.Descriptor, manifestBytes []byte, tag string) error
}

// TagChecker is implemented by sinks that can refuse a tag up front, so that a bad reference fails the pack
// before any blob is written.
type TagChecker interface {
	CheckTag(tag string) error
}

// Progress is told how many bytes of input Pack will read and, as it goes, how many it has read. Calls may come
// from several goroutines. A sink that reads a layer twice is counted twice.
type Progress interface {
	Start(total int64)
	Add(n int64)
}

// ModelfileName is the Modelfile Pack reads from the model directory when Options.Modelfile is empty.
const ModelfileName = "Modelfile"

// Options control Pack. The zero value packs with defaults.
type Options struct {
	// Tag is passed to Sink.Commit.
	Tag string
	// LayerFormat is the format of non-weight layers: raw (default, one layer per file), tar, tar+gzip or tar+zstd
	// (top-level sub-directories archived whole). Weights are always raw.
	LayerFormat artifact.Format
	// Modelfile is the path of a modctl-style Modelfile; empty means DIR/Modelfile if it exists.
	Modelfile string
	// Rules classify files and directories; they override the Modelfile's rules.
	Rules []Rule
	// Descriptor and Config fields that are set override what was inferred and what the Modelfile says.
	Descriptor artifact.ModelDescriptor
	Config     artifact.ModelConfig
	// Created, if set, is written as descriptor.createdAt, the manifest's org.opencontainers.image.created and the
	// mtime of archived files. Unset, there is no timestamp anywhere and the digest depends only on the files.
	Created *time.Time
	// Concurrency bounds the layers written at once; 0 means GOMAXPROCS.
	Concurrency int
	Progress    Progress
	// Remote are files added to those found in the directory, read from their source only when their layers are
	// written (see RemoteFile). The directory holds the other files and may hold nothing else.
	Remote []RemoteFile
	// Annotations are added to the manifest's.
	Annotations map[string]string
	// Source, if set, names the model in messages instead of the directory (hf://ORG/NAME@COMMIT).
	Source string
	// Warn, if set, hears about things that do not stop the pack (a weight header that cannot be parsed).
	Warn func(msg string)
	// Include and Exclude choose the directory's files with artifact.MatchInclude (the syntax of unpack
	// --include): with Include set only matching files are packed, and a file or directory matching Exclude is
	// left out. Directories left with no file are dropped. Remote files are not filtered (their source chose them).
	Include, Exclude []string
	// IgnoreFile is an ignore file (.gitignore's syntax and meaning, patterns relative to the model directory);
	// empty means DIR/.modelpackignore if it exists. NoIgnoreFile reads none. A file is packed when the ignore
	// file does not ignore it, Include (if set) admits it and Exclude does not name it: the flags narrow what the
	// ignore file leaves, never bring back what it ignores. The ignore file itself is never packed. Neither
	// applies to a lone file or to Remote files.
	IgnoreFile   string
	NoIgnoreFile bool
	// Strict makes a rule (flag or Modelfile) that matches nothing, or a file of unknown kind that no rule names,
	// an error before any blob is written instead of a warning.
	Strict bool
	// Summary, if set, is told once how the files were classified, after classification and before any blob is
	// written.
	Summary func(*Summary)
}

// epoch is the mtime of every archived file when no creation time is given.
var epoch = time.Unix(0, 0).UTC()

// Pack packs dir into sink and returns the manifest descriptor. Bad input (a missing or empty directory,
// special files, symlinks out of the directory, unreadable files, conflicting rules) is a *UserError reported
// before any blob is written.
func Pack(ctx context.Context, dir string, opts Options, sink Sink) (ocispec.Descriptor, error) {
	if err := checkFormat(&opts); err != nil {
		return ocispec.Descriptor{}, err
	}
	if c, ok := sink.(TagChecker); ok && opts.Tag != "" {
		if err := c.CheckTag(opts.Tag); err != nil {
			return ocispec.Descriptor{}, err
		}
	}
	pl, err := prepare(dir, opts)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer pl.tree.Close()
	dir, layers, nodes, name := pl.dir, pl.layers, pl.nodes, pl.name
	if opts.Summary != nil {
		opts.Summary(pl.summary)
	}
	model := inferModel(ctx, dir, layers, opts.Warn)
	model.Descriptor.Revision = pl.tree.commit
	applyModelfile(&model, pl.mf)
	applyOverrides(&model, opts)

	mtime := epoch
	if opts.Created != nil {
		mtime = opts.Created.UTC().Truncate(time.Second)
		model.Descriptor.CreatedAt = &mtime
	}
	if opts.Progress != nil {
		var total int64
		for _, l := range layers {
			total += l.size
		}
		opts.Progress.Start(total)
	}

	stated, _ := sink.(StatedSink)
	taken := map[string]bool{}
	for _, n := range nodes {
		taken[n.rel] = true
	}
	descs := make([]ocispec.Descriptor, len(layers))
	diffIDs := make([]digest.Digest, len(layers))
	g, gctx := errgroup.WithContext(ctx)
	limit := opts.Concurrency
	if limit <= 0 {
		limit = runtime.GOMAXPROCS(0)
	}
	g.SetLimit(limit)
	for i := range layers {
		g.Go(func() error {
			l := &layers[i]
			w := &layerWriter{ctx: gctx, plan: l, mtime: mtime, progress: opts.Progress}
			named := ocispec.Descriptor{MediaType: artifact.LayerMediaType(l.kind, l.format), Annotations: map[string]string{artifact.AnnotationTitle: l.path}}
			var d ocispec.Descriptor
			var err error
			if r := l.nodes[0].remote; l.format == artifact.FormatRaw && r != nil && stated != nil {
				named.Digest, named.Size = r.Digest, r.Size
				d, err = stated.AddStatedBlob(gctx, named, w.openAt)
			} else {
				d, err = sink.AddBlob(gctx, named, w.open)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", name(l.path), err)
			}
			diffIDs[i] = d.Digest
			if l.format == artifact.FormatTarGzip || l.format == artifact.FormatTarZstd {
				diffIDs[i] = w.diffID()
			}
			d.Annotations, err = annotations(l, mtime, diffIDs[i], taken)
			descs[i] = d
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return ocispec.Descriptor{}, err
	}

	model.ModelFS = artifact.ModelFS{Type: "layers", DiffIDs: diffIDs}
	configBytes, err := json.Marshal(model)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	// The last guard before anything is named: a config the spec's schema refuses is never tagged.
	if err := schema.ValidateConfig(configBytes); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("model config: %w", err)
	}
	configDesc, err := sink.AddBlob(ctx, ocispec.Descriptor{MediaType: artifact.MediaTypeModelConfig}, bytesOpener(configBytes))
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("store config: %w", err)
	}
	manifest := ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: artifact.ArtifactTypeModelManifest,
		Config:       configDesc,
		Layers:       descs,
	}
	if len(opts.Annotations) > 0 || opts.Created != nil {
		manifest.Annotations = maps.Clone(opts.Annotations)
		if manifest.Annotations == nil {
			manifest.Annotations = map[string]string{}
		}
		if opts.Created != nil {
			manifest.Annotations[ocispec.AnnotationCreated] = mtime.Format(time.RFC3339)
		}
	}
	manifestBytes, err := json.Marshal(manifest)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc := ocispec.Descriptor{
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: artifact.ArtifactTypeModelManifest,
		Digest:       digest.FromBytes(manifestBytes),
		Size:         int64(len(manifestBytes)),
	}
	if err := sink.Commit(ctx, desc, manifestBytes, opts.Tag); err != nil {
		return ocispec.Descriptor{}, err
	}
	return desc, nil
}

// prepared is a model directory read and classified: everything Pack knows before it writes a blob.
type prepared struct {
	tree    *tree
	dir     string // the directory read (a lone file's directory)
	mf      *Modelfile
	nodes   []node
	layers  []layerPlan
	name    func(rel string) string
	summary *Summary
}

// Plan reads and classifies dir as Pack would, and returns what Pack would write, writing nothing: what
// `pack --dry-run` prints. File contents are not read (a layer's digest is known only for a Hub file).
func Plan(dir string, opts Options) (*Summary, error) {
	if err := checkFormat(&opts); err != nil {
		return nil, err
	}
	pl, err := prepare(dir, opts)
	if err != nil {
		return nil, err
	}
	pl.tree.Close()
	return pl.summary, nil
}

func checkFormat(opts *Options) error {
	switch opts.LayerFormat {
	case "":
		opts.LayerFormat = artifact.FormatRaw
	case artifact.FormatRaw, artifact.FormatTar, artifact.FormatTarGzip, artifact.FormatTarZstd:
	default:
		return fmt.Errorf("unknown layer format %q (valid: raw, tar, tar+gzip, tar+zstd)", opts.LayerFormat)
	}
	return nil
}

// prepare lists, filters and classifies dir's files and says (opts.Warn) what a pack of them should still hear;
// the caller closes the tree.
func prepare(dir string, opts Options) (_ *prepared, err error) {
	// A lone file (model.gguf, as oras and ollama take one) packs as a model of that one file, read from its
	// directory.
	only := ""
	if fi, err := os.Stat(dir); err == nil && fi.Mode().IsRegular() {
		dir, only = filepath.Dir(dir), filepath.Base(dir)
	}
	t, err := openTree(dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	t.only = only
	mf, mfRel := &Modelfile{}, ""
	if only == "" || opts.Modelfile != "" { // the Modelfile beside a lone file is not its recipe
		if mf, mfRel, err = loadModelfile(t, dir, opts.Modelfile); err != nil {
			return nil, err
		}
	}
	// The Modelfile is the recipe, not part of the model: DIR/Modelfile is never packed, nor is one named by
	// Options.Modelfile inside DIR.
	skip := map[string]bool{ModelfileName: true, IgnoreFileName: true}
	if mfRel != "" {
		skip[mfRel] = true
	}
	var ig *ignoreFile
	if only == "" {
		var igRel string
		if ig, igRel, err = loadIgnore(t, dir, opts); err != nil {
			return nil, err
		}
		if igRel != "" {
			skip[igRel] = true
		}
	}
	shown, name := dir, func(rel string) string { return filepath.Join(dir, filepath.FromSlash(rel)) }
	if opts.Source != "" {
		shown, name = opts.Source, func(rel string) string { return opts.Source + "/" + rel }
	}
	nodes, err := t.walk(name, skip, len(opts.Remote) > 0)
	if err != nil {
		return nil, err
	}
	if nodes, err = chooseFiles(nodes, ig, opts.Include, opts.Exclude, name); err != nil {
		return nil, err
	}
	if nodes, err = addRemote(name, nodes, opts.Remote); err != nil {
		return nil, err
	}
	layers, unused, err := plan(name, nodes, opts.LayerFormat, opts.Rules, mf.Rules)
	if err != nil {
		return nil, err
	}
	if opts.Strict && len(unused) > 0 {
		r := unused[0]
		return nil, badInput(shown, "%s %s %q matches nothing; nothing was packed (strict)", r.Source, r.Kind, r.Pattern)
	}
	summary := summarize(layers)
	if opts.Strict && len(summary.Unknown) > 0 {
		return nil, badInput(shown, "%s; nothing was packed (strict)", unknownWarning(summary.Unknown))
	}
	if opts.Warn != nil {
		for _, msg := range planWarnings(shown, layers, unused, len(mf.Rules) > 0) {
			opts.Warn(msg)
		}
		if len(summary.Unknown) > 0 {
			opts.Warn(unknownWarning(summary.Unknown))
		}
	}
	return &prepared{tree: t, dir: dir, mf: mf, nodes: nodes, layers: layers, name: name, summary: summary}, nil
}

func bytesOpener(b []byte) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

// planWarnings are what a pack that succeeds should still say: rules that matched nothing, no weights at all, and
// non-weight files a Modelfile does not name, which are packed by what their names suggest (weight.config for
// names it does not know).
func planWarnings(dir string, layers []layerPlan, unused []Rule, modelfile bool) []string {
	var msgs []string
	for _, r := range unused {
		msgs = append(msgs, fmt.Sprintf("%s %s %q matches nothing in %s", r.Source, r.Kind, r.Pattern, dir))
	}
	weights := false
	var uncovered []string
	for _, l := range layers {
		weights = weights || l.kind == artifact.KindWeight
		if !l.ruled && l.kind != artifact.KindWeight { // weights are known by their extension
			uncovered = append(uncovered, fmt.Sprintf("%s (%s)", l.path, l.kind))
		}
	}
	if !weights {
		msgs = append(msgs, fmt.Sprintf("%s holds no weight files (safetensors, gguf, bin, pt, onnx, …): the artifact has no weight layer; name weights with --kind GLOB=weight or a Modelfile MODEL line", dir))
	}
	if modelfile && len(uncovered) > 0 {
		msgs = append(msgs, fmt.Sprintf("the Modelfile names no rule for %s: packed by file name", listPaths(uncovered)))
	}
	return msgs
}

// loadModelfile reads the Modelfile named by the options, or DIR/Modelfile if present (read from the tree, as
// the model's files are). It returns the model-relative path of a Modelfile inside dir, which is not packed.
func loadModelfile(t *tree, dir, name string) (*Modelfile, string, error) {
	var f io.ReadCloser
	var err error
	if name == "" {
		name = filepath.Join(dir, ModelfileName)
		f, err = t.root.Open(path.Join(t.prefix, ModelfileName))
		if errors.Is(err, os.ErrNotExist) {
			return &Modelfile{}, "", nil
		}
	} else {
		f, err = os.Open(name)
	}
	if err != nil {
		return nil, "", badInput(name, "cannot read Modelfile: %v", unwrapPathError(err))
	}
	defer f.Close()
	mf, err := ParseModelfile(f, name)
	if err != nil {
		return nil, "", err
	}
	rel := ""
	if absDir, err1 := filepath.Abs(dir); err1 == nil {
		if absName, err2 := filepath.Abs(name); err2 == nil {
			if r, err := filepath.Rel(absDir, absName); err == nil && filepath.IsLocal(r) {
				rel = filepath.ToSlash(r)
			}
		}
	}
	return mf, rel, nil
}

// annotations are the layer's file path, its file metadata and its title, which generic OCI tools (oras) use as
// the file name. A tar+gzip directory also carries ORAS's unpack annotations, so `oras pull` recreates it.
// taken holds every model-relative path of the model.
func annotations(l *layerPlan, mtime time.Time, diffID digest.Digest, taken map[string]bool) (map[string]string, error) {
	meta := artifact.FileMetadata{Name: path.Base(l.path), ModTime: mtime, Typeflag: '0'}
	if l.dir {
		meta.Typeflag = '5'
	}
	if len(l.nodes) > 0 && l.nodes[0].rel == l.path {
		meta.Mode = uint32(l.nodes[0].mode)
		meta.Size = l.nodes[0].size
	} else {
		meta.Mode = 0o755
	}
	b, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	a := map[string]string{
		artifact.AnnotationFilepath:     l.path,
		artifact.AnnotationFileMetadata: string(b),
		artifact.AnnotationTitle:        archiveTitle(l, taken),
	}
	if l.dir && l.format == artifact.FormatTarGzip {
		a["io.deis.oras.content.digest"] = diffID.String()
		a["io.deis.oras.content.unpack"] = "true"
	}
	return a, nil
}

// archiveTitle is the file name generic tools (oras pull) write a layer under. oras unpacks only tar+gzip
// directories; it writes any other archive as a file named by its title. Titled with the bare directory name, that
// file would collide with the directory the model's raw files inside it create (onnx/model.onnx beside the archive
// of onnx/), so such an archive is titled as one: onnx.tar, onnx.tar.zst, which `tar -xf` unpacks in place (its
// entries are model-relative). A name the model itself uses gets a further .layer suffix.
func archiveTitle(l *layerPlan, taken map[string]bool) string {
	if !l.dir || l.format == artifact.FormatTarGzip || l.path == "" {
		return l.path
	}
	ext := ".tar"
	if l.format == artifact.FormatTarZstd {
		ext = ".tar.zst"
	}
	title := l.path + ext
	for taken[title] {
		title = strings.TrimSuffix(title, ext) + ".layer" + ext
	}
	return title
}

// layerWriter produces one layer's bytes each time the sink opens it.
type layerWriter struct {
	ctx      context.Context
	plan     *layerPlan
	mtime    time.Time
	progress Progress

	mu   sync.Mutex
	diff digest.Digest // digest of the uncompressed tar, set when a full pass completes
}

func (w *layerWriter) open() (io.ReadCloser, error) {
	if w.plan.format == artifact.FormatRaw {
		return w.plan.nodes[0].open(w.ctx, w.progress)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(w.writeArchive(pw)) }()
	return pr, nil
}

// openAt reads a remote raw layer for a StatedSink from offset, unchecked: the sink checks it (StatedSink).
func (w *layerWriter) openAt(ctx context.Context, offset int64) (io.ReadCloser, int64, error) {
	rc, start, err := w.plan.nodes[0].remote.Open(ctx, offset)
	if err != nil {
		return nil, 0, err
	}
	return &countingReader{rc: rc, progress: w.progress}, start, nil
}

// countingReader tells progress of the bytes read.
type countingReader struct {
	rc       io.ReadCloser
	progress Progress
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.rc.Read(p)
	if n > 0 && c.progress != nil {
		c.progress.Add(int64(n))
	}
	return n, err
}

func (c *countingReader) Close() error { return c.rc.Close() }

func (w *layerWriter) diffID() digest.Digest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.diff
}

// checkedFile reads a file opened from the tree and fails at its end if the file changed since the walk listed
// it or while it was read (package beneath): a file rewritten or swapped while being packed must not be stored
// under a descriptor that claims otherwise.
type checkedFile struct {
	f        *beneath.File
	n, want  int64
	progress Progress
}

func (c *checkedFile) Read(p []byte) (int, error) {
	n, err := c.f.Read(p)
	c.n += int64(n)
	if c.progress != nil && n > 0 {
		c.progress.Add(int64(n))
	}
	if err == io.EOF {
		if c.n != c.want {
			return n, fmt.Errorf("file changed while it was read: read %d bytes, expected %d", c.n, c.want)
		}
		if err := c.f.Unchanged(); err != nil {
			return n, unwrapPathError(err)
		}
	}
	return n, err
}

func (c *checkedFile) Close() error { return c.f.Close() }
