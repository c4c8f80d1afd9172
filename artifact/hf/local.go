package hf

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/pack"
	"github.com/modelpack/modelpack/internal/errdef"
)

// Offline reports whether HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set to a true value, as huggingface_hub
// reads them (1, ON, YES, TRUE, any case): the Hub is then not contacted and only its local cache is read.
func Offline() bool {
	v := os.Getenv("HF_HUB_OFFLINE")
	if v == "" {
		v = os.Getenv("TRANSFORMERS_OFFLINE")
	}
	switch strings.ToUpper(strings.TrimSpace(v)) {
	case "1", "ON", "YES", "TRUE":
		return true
	}
	return false
}

// CacheDir is the local Hub cache as huggingface_hub finds it: HF_HUB_CACHE, else the older HUGGINGFACE_HUB_CACHE,
// else $HF_HOME/hub (HF_HOME defaulting to $XDG_CACHE_HOME/huggingface, then ~/.cache/huggingface).
func CacheDir() string {
	for _, k := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return filepath.Join(hfHome(), "hub")
}

func hfHome() string {
	if home := os.Getenv("HF_HOME"); home != "" {
		return home
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		if h, err := os.UserHomeDir(); err == nil {
			cache = filepath.Join(h, ".cache")
		}
	}
	return filepath.Join(cache, "huggingface")
}

// repoFolder is huggingface_hub's folder of a repository in its cache: models--ORG--NAME, datasets--ORG--NAME.
func repoFolder(ref Ref) string {
	kind := "models"
	if ref.IsDataset() {
		kind = "datasets"
	}
	return kind + "--" + strings.ReplaceAll(ref.ID(), "/", "--")
}

// LocalSnapshot is Snapshot from the local Hub cache at cacheDir, in huggingface_hub's layout, never the network:
// <cacheDir>/models--ORG--NAME/refs/<branch or tag> holds the commit a revision names (a commit is used as it
// is), and snapshots/<commit>/ the files, as links into blobs/ named by the file's sha256 (LFS files) or git blob
// id (the others). An LFS file is read from the cache when its layer is written and checked against the sha256
// its blob is named by; any other file is copied into the staging directory and checked against its git blob id.
// The snapshot is packed as the cache holds it (huggingface_hub too may have fetched only some of its files); its
// descriptor records the commit and the Hub's page (HF_ENDPOINT), and nothing the API would have said (licenses,
// the commit's date).
func LocalSnapshot(cacheDir string, ref Ref, opts Options) (_ *Snapshot, err error) {
	if err := checkGlobs(opts.Include, "--include"); err != nil {
		return nil, err
	}
	if err := checkGlobs(opts.Exclude, "--exclude"); err != nil {
		return nil, err
	}
	snapDir, commit, err := LocalSnapshotDir(cacheDir, ref)
	if err != nil {
		return nil, err
	}
	// A snapshot's links point into the repository's blobs/; a link anywhere else (a cache another user can write
	// to, a link planted by a download gone wrong) would pack that file — ~/.ssh/id_rsa as a weight — and is refused.
	blobsDir, err := filepath.EvalSymlinks(filepath.Join(snapDir, "..", "..", "blobs"))
	if err != nil {
		blobsDir = "" // no blobs/: only plain files may be packed
	}
	var all, kept []localFile
	err = filepath.WalkDir(snapDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(snapDir, p)
		if d.IsDir() {
			return nil
		}
		f, err := statLocal(p, filepath.ToSlash(rel), blobsDir)
		if err != nil {
			return err
		}
		all = append(all, f)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: reading the local Hub cache: %w", ref, err)
	}
	entries := make([]Entry, 0, len(all))
	for _, f := range all {
		entries = append(entries, Entry{Type: "file", Path: f.rel, Size: f.size})
	}
	dir, err := os.MkdirTemp(opts.TempDir, "modelpack-hf-")
	if err != nil {
		return nil, err
	}
	s := &Snapshot{Ref: ref, Commit: commit, Dir: dir, Unmatched: unmatchedGlobs(entries, opts)}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if opts.Strict && len(s.Unmatched) > 0 {
		return nil, fmt.Errorf("%s matches no file of %s (commit %s, local Hub cache); nothing was packed (strict)", strings.Join(s.Unmatched, ", "), ref, commit)
	}
	for _, f := range all {
		if !hidden(f.rel) && selected(f.rel, opts) {
			kept = append(kept, f)
		}
	}
	if len(kept) == 0 {
		return nil, fmt.Errorf("%s (commit %s, local Hub cache) has no file to pack%s", ref, commit, filterNote(opts))
	}
	endpoint := os.Getenv("HF_ENDPOINT")
	if endpoint == "" {
		endpoint = DefaultEndpoint
	}
	source := strings.TrimRight(endpoint, "/") + "/" + ref.Repo
	s.Descriptor = artifact.ModelDescriptor{SourceURL: source, Revision: commit, Name: path.Base(ref.Repo)}
	s.Annotations = map[string]string{"org.opencontainers.image.source": source, "org.opencontainers.image.revision": commit}
	for _, f := range kept {
		if f.sha256 != "" {
			s.Remote = append(s.Remote, f.remoteFile())
			continue
		}
		if err := f.copyTo(dir); err != nil {
			return nil, fmt.Errorf("%s: %w", ref, err)
		}
	}
	return s, nil
}

// LocalSnapshotDir finds ref's snapshot in the local Hub cache at cacheDir (see LocalSnapshot): its directory and
// commit, or an error wrapping errdef.ErrNotFound that says what is missing and how to get it.
func LocalSnapshotDir(cacheDir string, ref Ref) (dir, commit string, err error) {
	repoDir := filepath.Join(cacheDir, repoFolder(ref))
	notCached := func(why string) error {
		return fmt.Errorf("%w: %s: %s in the local Hub cache %s (HF_HUB_CACHE, or $HF_HOME/hub), and HF_HUB_OFFLINE is set, so the Hub is not asked: "+
			"download it first (hf download %s --revision %s%s), or unset HF_HUB_OFFLINE", errdef.ErrNotFound, ref, why, cacheDir, ref.ID(), ref.Revision, repoTypeFlag(ref))
	}
	commit = ref.Revision
	if !isHex(commit, 40) {
		b, err := os.ReadFile(filepath.Join(repoDir, "refs", filepath.FromSlash(ref.Revision)))
		if err != nil {
			if _, serr := os.Stat(repoDir); serr != nil {
				return "", "", notCached("not")
			}
			return "", "", notCached(fmt.Sprintf("no revision %q (refs/%s)", ref.Revision, ref.Revision))
		}
		commit = strings.TrimSpace(string(b))
		if !isHex(commit, 40) {
			return "", "", fmt.Errorf("%s: the local Hub cache's refs/%s holds %q, not a commit", ref, ref.Revision, commit)
		}
	}
	snapDir := filepath.Join(repoDir, "snapshots", commit)
	if fi, err := os.Stat(snapDir); err != nil || !fi.IsDir() {
		return "", "", notCached(fmt.Sprintf("no snapshot of commit %s", commit))
	}
	return snapDir, commit, nil
}

func repoTypeFlag(ref Ref) string {
	if ref.IsDataset() {
		return " --repo-type dataset"
	}
	return ""
}

// localFile is a file of a cached snapshot: its path in the model, the file it links to, and what that blob's
// name says of its content.
type localFile struct {
	rel, blob   string
	size        int64
	sha256, oid string // from the blob's name: an LFS file's sha256, another file's git blob id; "" if neither
}

func statLocal(p, rel, blobsDir string) (localFile, error) {
	f := localFile{rel: rel, blob: p}
	li, err := os.Lstat(p)
	if err != nil {
		return f, err
	}
	if li.Mode()&fs.ModeSymlink != 0 {
		target, err := filepath.EvalSymlinks(p)
		if err != nil {
			return f, fmt.Errorf("%s: a link the local Hub cache cannot resolve: %w", rel, err)
		}
		if name := filepath.Base(target); blobsDir == "" || filepath.Dir(target) != blobsDir || !(isHex(name, 64) || isHex(name, 40)) {
			return f, fmt.Errorf("%s links to %s, which is not a blob of the local Hub cache (the repository's blobs/, named by sha256 or git blob id): refused, nothing packed", rel, target)
		}
		f.blob = target
	}
	fi, err := os.Stat(f.blob)
	if err != nil {
		return f, err
	}
	if !fi.Mode().IsRegular() {
		return f, fmt.Errorf("%s: not a regular file", rel)
	}
	f.size = fi.Size()
	switch name := filepath.Base(f.blob); {
	case f.blob == p: // a plain file (a copy, not a link into blobs/): nothing to check it against
	case isHex(name, 64):
		f.sha256 = name
	case isHex(name, 40):
		f.oid = name
	}
	return f, nil
}

// remoteFile reads an LFS file from the cache; the sink checks its sha256.
func (f localFile) remoteFile() pack.RemoteFile {
	return pack.RemoteFile{
		Path: f.rel, Size: f.size, Digest: digest.NewDigestFromEncoded(digest.SHA256, f.sha256),
		Open: func(ctx context.Context, offset int64) (io.ReadCloser, int64, error) {
			r, err := os.Open(f.blob)
			if err != nil {
				return nil, 0, err
			}
			if _, err := r.Seek(offset, io.SeekStart); err != nil {
				r.Close()
				return nil, 0, err
			}
			return r, offset, nil
		},
	}
}

// copyTo copies a small file into the staging directory, checked against the git blob id its blob is named by.
func (f localFile) copyTo(dir string) (err error) {
	src, err := os.Open(f.blob)
	if err != nil {
		return err
	}
	defer src.Close()
	dst := filepath.Join(dir, filepath.FromSlash(f.rel))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	h := newGitBlobHash(f.size)
	if _, err := io.Copy(io.MultiWriter(out, h), src); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); f.oid != "" && got != f.oid {
		return fmt.Errorf("%s: %w: the cached bytes' git blob id is %s, the cache names them %s; refused", f.rel, errdef.ErrDigestMismatch, got, f.oid)
	}
	return nil
}

// Rules are the classification a snapshot adds to the caller's: a dataset's files are packed as the dataset
// kind, except its card and other documents (README.md, LICENSE), and each file a user rule matches is left
// to that rule. A model's snapshot adds none.
func (s *Snapshot) Rules(user []pack.Rule) ([]pack.Rule, error) {
	if !s.Ref.IsDataset() {
		return nil, nil
	}
	var files []string
	for _, r := range s.Remote {
		files = append(files, r.Path)
	}
	err := filepath.WalkDir(s.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(s.Dir, p)
		files = append(files, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []pack.Rule
	for _, f := range files {
		if artifact.KindOf(f) == artifact.KindDoc || matchedBy(user, f) {
			continue
		}
		out = append(out, pack.Rule{Kind: artifact.KindDataset, Pattern: escapeMatch(f), Source: "hf://datasets (a dataset's file)"})
	}
	return out, nil
}

func matchedBy(rules []pack.Rule, p string) bool {
	for _, r := range rules {
		if r.Matches(p) {
			return true
		}
		// A rule naming a directory packs it whole: its files are that rule's too.
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if r.Matches(d) {
				return true
			}
		}
	}
	return false
}

// escapeMatch quotes p for path.Match, so that the rule matches exactly that path.
func escapeMatch(p string) string {
	var b strings.Builder
	for _, c := range p {
		if strings.ContainsRune(`*?[]\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}
