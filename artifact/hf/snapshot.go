package hf

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/pack"
	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/internal/diskio"
	"github.com/modelpack/modelpack/internal/errdef"
)

// Manifest annotations recording what the Hub states that the ModelPack config has no field for (its schema
// allows no other keys): the library the model is for and the model it derives from.
const (
	AnnotationLibrary   = "dev.modelpack.hf.library_name"
	AnnotationBaseModel = "dev.modelpack.hf.base_model"
)

// Options choose the files of a snapshot.
type Options struct {
	// Include, if set, keeps only files matching one of these globs; Exclude drops files matching one. A glob
	// without "/" also matches a file's base name ("*.safetensors"); one with "/" matches the whole path.
	Include, Exclude []string
	// Concurrency bounds the small files downloaded at once (default 8).
	Concurrency int
	// TempDir is where the staging directory is made (default os.TempDir).
	TempDir string
	// Strict makes an Include or Exclude glob that matches no file of the revision an error, before anything is
	// downloaded; otherwise Snapshot.Unmatched lists them.
	Strict bool
	// Dest, if set, is a directory on the file system the LFS files will be written to (the local store), and
	// Held, if set, says which of them it holds already: the others must fit in its free space, checked before
	// anything is downloaded or allocated. Unset (pack --push), only the staging directory's space is checked.
	Dest string
	Held func(digest.Digest, int64) bool
}

// maxFileSize bounds the size a listing may claim for one file, whatever the free space (pack --push writes the
// weights to no local disk): the Hub takes no file above 50 GB, so ten times that is a listing not to believe.
var maxFileSize int64 = 500 << 30

// Snapshot is a revision of a model ready to pack: pack.Pack(Dir, …) with Remote, Descriptor, Annotations and
// Created in its options.
type Snapshot struct {
	Ref    Ref    // the revision asked for
	Commit string // what it resolved to
	// Unmatched says which Include/Exclude globs match no file of the revision ("--include \"*.gguf\""), most
	// likely typos.
	Unmatched []string
	// Dir is a staging directory holding the files that are not in LFS (configs, tokenizers, docs), each checked
	// against its git blob id. Close removes it.
	Dir string
	// Remote are the LFS files (the weights), read from the Hub only when their layers are written and checked
	// against the sha256 the Hub states for them.
	Remote      []pack.RemoteFile
	Descriptor  artifact.ModelDescriptor // sourceURL, revision, licenses, name, datasets
	Annotations map[string]string
	Created     *time.Time // the commit's date: the same revision always packs to the same digest
}

// Close removes the staging directory.
func (s *Snapshot) Close() error { return os.RemoveAll(s.Dir) }

// Snapshot resolves ref, lists its files, downloads the small ones into a staging directory and describes the
// LFS ones.
func (c *Client) Snapshot(ctx context.Context, ref Ref, opts Options) (_ *Snapshot, err error) {
	if err := checkGlobs(opts.Include, "--include"); err != nil {
		return nil, err
	}
	if err := checkGlobs(opts.Exclude, "--exclude"); err != nil {
		return nil, err
	}
	info, err := c.Info(ctx, ref)
	if err != nil {
		return nil, err
	}
	commit := info.SHA
	created, err := c.CommitDate(ctx, ref.Repo, commit)
	if err != nil {
		return nil, err
	}
	entries, err := c.Tree(ctx, ref.Repo, commit)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(opts.TempDir, "modelpack-hf-")
	if err != nil {
		return nil, err
	}
	s := &Snapshot{Ref: ref, Commit: commit, Dir: dir, Created: &created, Unmatched: unmatchedGlobs(entries, opts)}
	if opts.Strict && len(s.Unmatched) > 0 {
		os.Remove(dir)
		return nil, fmt.Errorf("%s matches no file of %s (commit %s); nothing was packed (strict)", strings.Join(s.Unmatched, ", "), ref, commit)
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	s.Descriptor, s.Annotations = c.describe(ref.Repo, commit, info)

	g, gctx := errgroup.WithContext(ctx)
	limit := opts.Concurrency
	if limit <= 0 {
		limit = 8
	}
	g.SetLimit(limit)
	var kept []Entry
	for _, e := range entries {
		if e.Type == "file" && !hidden(e.Path) && selected(e.Path, opts) {
			kept = append(kept, e)
		}
	}
	if len(kept) == 0 {
		return nil, fmt.Errorf("%s (commit %s) has no file to pack%s", ref, commit, filterNote(opts))
	}
	if err := checkRoom(Scheme+ref.Repo+"@"+commit+"/", kept, dir, opts); err != nil {
		return nil, err
	}
	for _, e := range kept {
		if e.LFS != nil {
			s.Remote = append(s.Remote, c.remoteFile(ref.Repo, commit, e))
			continue
		}
		g.Go(func() error { return c.download(gctx, ref.Repo, commit, e, dir) })
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return s, nil
}

// checkRoom refuses, before anything is downloaded or allocated, a selection whose sizes, as the Hub states them,
// cannot fit or cannot be true: the files outside LFS must fit in the staging directory's free space, the LFS files
// the destination does not hold in its own (both together where they share a file system), and no file may claim
// more than maxFileSize. The error names the largest file, its claimed size and the free space. A file system whose free space cannot be read
// is not checked: the writes' own preallocation then refuses.
func checkRoom(prefix string, files []Entry, staging string, o Options) error {
	type need struct {
		dir, what string
		total     int64
		largest   *Entry
	}
	var stage, dest need
	stage.dir, stage.what = staging, "the staging directory"
	dest.dir, dest.what = o.Dest, "the local store"
	for i, e := range files {
		n := &stage
		if e.LFS != nil {
			if o.Dest == "" || (o.Held != nil && o.Held(digest.NewDigestFromEncoded(digest.SHA256, e.LFS.OID), e.Size)) {
				continue
			}
			n = &dest
		}
		n.total += e.Size
		if n.largest == nil || e.Size > n.largest.Size {
			n.largest = &files[i]
		}
	}
	if same, err := sameFS(stage.dir, dest.dir); err == nil && same {
		stage.total += dest.total
		if dest.largest != nil && (stage.largest == nil || dest.largest.Size > stage.largest.Size) {
			stage.largest = dest.largest
		}
		stage.what, dest = "the staging directory and the local store", need{}
	}
	for _, n := range []need{stage, dest} {
		if n.largest == nil {
			continue
		}
		free, err := diskio.FreeSpace(n.dir)
		if err != nil || n.total <= free {
			continue
		}
		also := ""
		if n.total != n.largest.Size {
			also = fmt.Sprintf(", %s in all", humanBytes(n.total))
		}
		return fmt.Errorf("%s%s: the Hub states a size of %s (%d bytes)%s, more than the %s (%d bytes) free for %s (%s); refused before downloading anything",
			prefix, n.largest.Path, humanBytes(n.largest.Size), n.largest.Size, also, humanBytes(free), free, n.what, n.dir)
	}
	for _, e := range files {
		if e.Size > maxFileSize {
			return fmt.Errorf("%s%s: the Hub states a size of %s (%d bytes), above the %s no Hub file reaches; refused before downloading anything", prefix, e.Path, humanBytes(e.Size), e.Size, humanBytes(maxFileSize))
		}
	}
	return nil
}

// sameFS reports whether a and b are on one file system.
func sameFS(a, b string) (bool, error) {
	if a == "" || b == "" {
		return false, nil
	}
	fa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	fb, err := os.Stat(b)
	if err != nil {
		return false, err
	}
	sa, oka := fa.Sys().(*syscall.Stat_t)
	sb, okb := fb.Sys().(*syscall.Stat_t)
	return oka && okb && sa.Dev == sb.Dev, nil
}

func humanBytes(n int64) string { return humanize.IBytes(uint64(max(n, 0))) }

// unmatchedGlobs names the Include and Exclude globs that match no file of entries, as the flags were written.
func unmatchedGlobs(entries []Entry, o Options) []string {
	var out []string
	for _, set := range []struct {
		flag  string
		globs []string
	}{{"--include", o.Include}, {"--exclude", o.Exclude}} {
		for _, g := range set.globs {
			hit := false
			for _, e := range entries {
				if e.Type == "file" && !hidden(e.Path) && matches(g, e.Path) {
					hit = true
					break
				}
			}
			if !hit {
				out = append(out, fmt.Sprintf("%s %q", set.flag, g))
			}
		}
	}
	return out
}

func filterNote(o Options) string {
	if len(o.Include) == 0 && len(o.Exclude) == 0 {
		return ""
	}
	return " that --include/--exclude keep"
}

// checkGlobs refuses only the empty pattern: fnmatch reads every other string (an unclosed "[" is a literal), and an
// empty one can select no file, which is surely a quoting slip.
func checkGlobs(globs []string, flag string) error {
	for _, g := range globs {
		if g == "" {
			return fmt.Errorf("%s \"\": an empty pattern selects no file; give a glob such as \"*.safetensors\"", flag)
		}
	}
	return nil
}

// matches is huggingface_hub's allow_patterns/ignore_patterns test (see fnmatch.go).
func matches(glob, p string) bool { return hubMatch(glob, p) }

func selected(p string, o Options) bool {
	in := len(o.Include) == 0
	for _, g := range o.Include {
		in = in || matches(g, p)
	}
	for _, g := range o.Exclude {
		in = in && !matches(g, p)
	}
	return in
}

// hidden files (.gitattributes, .github/…) are git's plumbing, and left out as a model directory's are.
func hidden(p string) bool {
	for _, c := range strings.Split(p, "/") {
		if strings.HasPrefix(c, ".") {
			return true
		}
	}
	return false
}

// remoteFile reads an LFS file from the Hub, resuming from the byte a dropped connection stopped at.
func (c *Client) remoteFile(repo, commit string, e Entry) pack.RemoteFile {
	desc := ocispec.Descriptor{Digest: digest.NewDigestFromEncoded(digest.SHA256, e.LFS.OID), Size: e.Size}
	return pack.RemoteFile{
		Path: e.Path, Size: e.Size, Digest: desc.Digest,
		Open: func(ctx context.Context, offset int64) (io.ReadCloser, int64, error) {
			return remote.NewResumableReader(ctx, desc, offset, func(ctx context.Context, offset int64) (io.ReadCloser, int64, error) {
				return c.OpenFile(ctx, repo, commit, e.Path, offset)
			}, remote.Timeouts{Idle: c.idle}), offset, nil
		},
	}
}

// download writes a file that is not in LFS into dir, checking it against its git blob id as it streams: its size
// is the Hub's statement, so it is never held in memory (eight files of a hostile listing's size at once would be).
// A file whose bytes differ is removed.
func (c *Client) download(ctx context.Context, repo, commit string, e Entry, dir string) (err error) {
	what := Scheme + repo + "@" + commit + "/" + e.Path
	dst := filepath.Join(dir, filepath.FromSlash(e.Path))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err) // a path listed twice, or a file where a listing put a directory
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	rc := remote.NewResumableReader(ctx, ocispec.Descriptor{Digest: digest.Digest(what), Size: e.Size}, 0, func(ctx context.Context, offset int64) (io.ReadCloser, int64, error) {
		return c.OpenFile(ctx, repo, commit, e.Path, offset)
	}, remote.Timeouts{Idle: c.idle})
	defer rc.Close()
	h := newGitBlobHash(e.Size)
	if _, err := io.Copy(io.MultiWriter(f, h), rc); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != e.OID {
		return fmt.Errorf("%s: %w: the bytes' git blob id is %s, the Hub states %s; refused", what, errdef.ErrDigestMismatch, got, e.OID)
	}
	return nil
}

// newGitBlobHash hashes a file's content of size bytes into the id git gives it: sha1 of "blob <size>\0<content>".
func newGitBlobHash(size int64) hash.Hash {
	h := sha1.New()
	h.Write([]byte("blob " + strconv.FormatInt(size, 10) + "\x00"))
	return h
}

// describe turns what the Hub says of the model into the config's descriptor and manifest annotations.
func (c *Client) describe(repo, commit string, info *ModelInfo) (artifact.ModelDescriptor, map[string]string) {
	source := c.Endpoint() + "/" + repo
	d := artifact.ModelDescriptor{SourceURL: source, Revision: commit, Name: path.Base(repo)}
	a := map[string]string{ocispec.AnnotationSource: source, ocispec.AnnotationRevision: commit}
	library := info.LibraryName
	if card := info.CardData; card != nil {
		for _, l := range card.License {
			if l == "other" && card.LicenseName != "" {
				l = card.LicenseName
			}
			d.Licenses = append(d.Licenses, spdx(l))
		}
		for _, ds := range card.Datasets {
			if ds != "" && !strings.ContainsAny(ds, " \t\n") {
				d.DatasetsURL = append(d.DatasetsURL, c.Endpoint()+"/datasets/"+ds)
			}
		}
		if len(card.BaseModel) > 0 {
			a[AnnotationBaseModel] = strings.Join(card.BaseModel, ",")
		}
		if library == "" {
			library = card.LibraryName
		}
	}
	if library != "" {
		a[AnnotationLibrary] = library
	}
	return d, a
}

// spdx maps the Hub's license ids to SPDX ids where they name the same license; others are kept as the Hub says.
func spdx(id string) string {
	known := map[string]string{
		"apache-2.0": "Apache-2.0", "mit": "MIT", "bsd-2-clause": "BSD-2-Clause", "bsd-3-clause": "BSD-3-Clause",
		"cc0-1.0": "CC0-1.0", "cc-by-4.0": "CC-BY-4.0", "cc-by-sa-4.0": "CC-BY-SA-4.0", "cc-by-nc-4.0": "CC-BY-NC-4.0",
		"cc-by-nc-sa-4.0": "CC-BY-NC-SA-4.0", "cc-by-nd-4.0": "CC-BY-ND-4.0", "gpl-3.0": "GPL-3.0-only",
		"gpl-2.0": "GPL-2.0-only", "lgpl-3.0": "LGPL-3.0-only", "agpl-3.0": "AGPL-3.0-only", "mpl-2.0": "MPL-2.0",
		"unlicense": "Unlicense", "artistic-2.0": "Artistic-2.0", "openrail": "OpenRAIL", "bsl-1.0": "BSL-1.0",
	}
	if s, ok := known[strings.ToLower(id)]; ok {
		return s
	}
	return id
}
