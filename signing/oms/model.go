package oms

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"golang.org/x/crypto/blake2b"
	"golang.org/x/sync/errgroup"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/internal/beneath"
)

// Files is a model as found: each resource name (a file path, or "path:start:end" for shards) with its hex digest.
type Files map[string]string

// ErrMismatch is wrapped by every difference between a model and its signed statement.
var ErrMismatch = errors.New("model does not match its OMS signature")

// Mismatch is one file that differs from the statement.
type Mismatch struct {
	File   string
	Reason string
}

// MismatchError lists every file that differs, in path order.
type MismatchError struct{ Files []Mismatch }

func (e *MismatchError) Error() string {
	var b strings.Builder
	for i, m := range e.Files {
		if i == 3 {
			fmt.Fprintf(&b, "; and %d more", len(e.Files)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "file %q %s", m.File, m.Reason)
	}
	return b.String()
}

func (e *MismatchError) Unwrap() error { return ErrMismatch }

// Check compares the model with the statement: every resource must be there with its digest, and nothing else may
// be. It reports every file that differs.
func (st *Statement) Check(actual Files) error {
	var out []Mismatch
	want := map[string]string{}
	for _, r := range st.Resources {
		want[r.Name] = r.Digest
		got, ok := actual[r.Name]
		switch {
		case !ok:
			out = append(out, Mismatch{r.File(st.Serialization.Method), "is signed but missing from the model" + shardNote(r.Name, st)})
		case !strings.EqualFold(got, r.Digest):
			out = append(out, Mismatch{r.File(st.Serialization.Method), fmt.Sprintf("has digest %s:%s, the signature says %s:%s%s", st.Serialization.HashType, got, st.Serialization.HashType, r.Digest, shardNote(r.Name, st))})
		}
	}
	for name := range actual {
		if _, ok := want[name]; !ok {
			out = append(out, Mismatch{Resource{Name: name}.File(st.Serialization.Method), "is not listed in the signature" + shardNote(name, st)})
		}
	}
	if len(out) == 0 {
		return nil
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].File < out[j].File })
	return &MismatchError{Files: dedupe(out)}
}

func shardNote(name string, st *Statement) string {
	if st.Serialization.Method != MethodShards {
		return ""
	}
	if _, s, err := splitShard(name); err == nil {
		return fmt.Sprintf(" (bytes %d to %d)", s.start, s.end)
	}
	return ""
}

// dedupe keeps one entry per file and reason: a file of many shards is named once per kind of difference.
func dedupe(ms []Mismatch) []Mismatch {
	seen := map[string]bool{}
	out := ms[:0]
	for _, m := range ms {
		key := m.File + "\x00" + strings.SplitN(m.Reason, " (bytes", 2)[0]
		if !seen[key] {
			seen[key] = true
			out = append(out, m)
		}
	}
	return out
}

// DefaultIgnores are the paths the reference leaves out of every model (its ignore_git_paths default) besides
// the signature file.
var DefaultIgnores = []string{".git", ".gitattributes", ".github", ".gitignore"}

// HashDir computes a model directory (or a single file) as ser says: files or shards, with its hash, leaving
// out ser.IgnorePaths, DefaultIgnores and ignore (paths relative to the model). The statement's own serialization
// is the one to pass: a verifier computes the model again as it was signed.
//
// The directory is opened once and every file hashed from a descriptor opened through no link (package beneath),
// so a file or directory swapped for a link during the walk is refused, never hashed; a file that changes while
// hashed is refused too. Only with ser.AllowSymlinks are links followed, as the reference follows them.
func HashDir(root string, ser Serialization, ignore []string) (Files, error) {
	newHash, err := hasher(ser.HashType)
	if err != nil {
		return nil, err
	}
	info, err := os.Lstat(root)
	if err != nil {
		return nil, err
	}
	dir, single := root, ""
	if !info.IsDir() {
		if info.Mode()&fs.ModeSymlink != 0 && !ser.AllowSymlinks {
			return nil, fmt.Errorf("%s is a symbolic link and the signature does not allow them", root)
		}
		dir, single = filepath.Dir(root), filepath.Base(root)
	}
	d, err := beneath.OpenDir(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	type job struct {
		rel    string // the resource name
		at     string // below d
		follow bool   // a link the signature allows: opened by path, following it
		listed beneath.Stat
	}
	var jobs []job
	if single != "" {
		st, err := d.Lstat(single)
		if err != nil {
			return nil, err
		}
		jobs = append(jobs, job{rel: ".", at: single, follow: st.Mode&fs.ModeSymlink != 0, listed: st})
	} else {
		skip := map[string]bool{}
		for _, p := range append(append(append([]string{}, DefaultIgnores...), ser.IgnorePaths...), ignore...) {
			skip[path.Clean(filepath.ToSlash(p))] = true
		}
		err = d.Walk("", func(e beneath.Entry) error {
			rel, t := e.Rel, e.Stat.Mode
			if skip[rel] {
				return beneath.SkipDir
			}
			switch {
			case t.IsDir():
				return nil
			case t&fs.ModeSymlink != 0:
				if !ser.AllowSymlinks {
					return fmt.Errorf("file %q is a symbolic link and the signature does not allow them (allow_symlinks: false)", rel)
				}
				if fi, err := os.Stat(filepath.Join(dir, rel)); err != nil || !fi.Mode().IsRegular() {
					return fmt.Errorf("file %q: a symbolic link to something other than a file", rel)
				}
			case !t.IsRegular():
				return fmt.Errorf("file %q is neither a regular file nor a directory", rel)
			}
			jobs = append(jobs, job{rel: rel, at: rel, follow: t&fs.ModeSymlink != 0, listed: e.Stat})
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	type result struct {
		name, digest string
	}
	results := make([][]result, len(jobs))
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, j := range jobs {
		g.Go(func() error {
			var f *os.File
			var check func() error
			if j.follow {
				o, err := os.Open(filepath.Join(dir, j.at))
				if err != nil {
					return err
				}
				if fi, err := o.Stat(); err != nil || !fi.Mode().IsRegular() {
					o.Close()
					return fmt.Errorf("file %q: a symbolic link to something other than a file", j.rel)
				}
				f, check = o, func() error { return nil }
			} else {
				b, err := d.Open(j.at)
				if err == nil {
					err = b.Same(j.listed)
					if err != nil {
						b.Close()
					}
				}
				if err != nil {
					return fmt.Errorf("file %q: %w", j.rel, unwrapPath(err))
				}
				f, check = b.File, b.Unchanged
			}
			defer f.Close()
			if ser.Method != MethodShards {
				h := newHash()
				if _, err := io.Copy(h, f); err != nil {
					return fmt.Errorf("file %q: %w", j.rel, err)
				}
				if err := check(); err != nil {
					return fmt.Errorf("file %q: %w", j.rel, unwrapPath(err))
				}
				results[i] = []result{{j.rel, hex.EncodeToString(h.Sum(nil))}}
				return nil
			}
			fi, err := f.Stat()
			if err != nil {
				return err
			}
			// The reference's shards: [0,s), [s,2s), …, the last one ending at the size; an empty file has none.
			for start := int64(0); start < fi.Size(); start += ser.ShardSize {
				end := min(start+ser.ShardSize, fi.Size())
				h := newHash()
				if _, err := io.Copy(h, io.NewSectionReader(f, start, end-start)); err != nil {
					return fmt.Errorf("file %q: %w", j.rel, err)
				}
				results[i] = append(results[i], result{fmt.Sprintf("%s:%d:%d", j.rel, start, end), hex.EncodeToString(h.Sum(nil))})
			}
			if err := check(); err != nil {
				return fmt.Errorf("file %q: %w", j.rel, unwrapPath(err))
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	out := Files{}
	for _, rs := range results {
		for _, r := range rs {
			out[r.name] = r.digest
		}
	}
	return out, nil
}

// unwrapPath drops the path of an *fs.PathError: the message names the file already.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func hasher(t string) (func() hash.Hash, error) {
	switch t {
	case "sha256":
		return sha256.New, nil
	case "blake2":
		return func() hash.Hash { h, _ := blake2b.New512(nil); return h }, nil
	}
	return nil, fmt.Errorf("hash_type %q is not supported (valid: sha256, blake2)", t)
}

// ErrNeedsRehash: the statement or the artifact's layers cannot be compared from the manifest alone.
var ErrNeedsRehash = errors.New("OMS check needs the files re-read")

// ArtifactFiles is the model an OCI artifact carries, from its manifest alone: a raw layer's digest is the
// sha256 of its file, so nothing is downloaded or hashed again. The layer at sigPath (the signature travelling
// inside the artifact; "" for none) is left out; every other layer counts, so a file the statement does not list is refused
// even where the statement's ignore_paths would skip it in a directory: nothing unsigned is mounted.
//
// What cannot be checked this way is refused (ErrNeedsRehash): a tar layer (its files' digests are known only
// after reading and unpacking the whole layer), and shard or BLAKE2 serializations (every byte of every file
// hashed again).
func ArtifactFiles(layers []artifact.Layer, ser Serialization, sigPath string) (Files, error) {
	if ser.Method != MethodFiles || ser.HashType != "sha256" {
		return nil, fmt.Errorf("%w: the signature uses %s serialization with %s; an artifact's layer digests give file serialization with sha256 (model_signing's default) without reading the files again", ErrNeedsRehash, ser.Method, ser.HashType)
	}
	out := Files{}
	for _, l := range layers {
		p := path.Clean(l.Path)
		switch {
		case l.Image:
			return nil, fmt.Errorf("%w: layer %s is a container-image layer, not a model file", ErrNeedsRehash, l.Digest)
		case l.Format != artifact.FormatRaw:
			return nil, fmt.Errorf("%w: layer %s is a %s archive of %q: its files' digests are known only after reading it all; pack the model with raw layers (the default) to carry an OMS signature", ErrNeedsRehash, l.Digest, l.Format, l.Path)
		case p == sigPath:
			continue
		case l.Digest.Algorithm() != "sha256":
			return nil, fmt.Errorf("%w: layer %s of file %q is not named by sha256", ErrNeedsRehash, l.Digest, l.Path)
		}
		out[p] = l.Digest.Encoded()
	}
	return out, nil
}

// VerifyDir checks a model directory (or single file) against the signature file at sigPath with v: the
// signature, then every file. The signature file itself is left out of the model when it lies inside it.
func VerifyDir(model, sigPath string, v Verifier, ignore []string) (*Statement, error) {
	data, err := readLimited(sigPath)
	if err != nil {
		return nil, err
	}
	sig, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sigPath, err)
	}
	st, err := sig.Verify(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sigPath, err)
	}
	ign := append([]string{}, ignore...)
	if absModel, err := filepath.Abs(model); err == nil {
		if absSig, err := filepath.Abs(sigPath); err == nil {
			if rel, err := filepath.Rel(absModel, absSig); err == nil && rel != "." && !strings.HasPrefix(rel, "..") {
				ign = append(ign, rel)
			}
		}
	}
	files, err := HashDir(model, st.Serialization, ign)
	if err != nil {
		return nil, err
	}
	err = st.Check(files)
	var me *MismatchError
	if errors.As(err, &me) {
		for i := range me.Files {
			if me.Files[i].File == "." { // a single-file model: name the file
				me.Files[i].File = filepath.Base(model)
			}
		}
	}
	return st, err
}

func readLimited(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSignatureSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxSignatureSize {
		return nil, fmt.Errorf("%s: over the %d-byte limit of a signature", p, maxSignatureSize)
	}
	return data, nil
}
