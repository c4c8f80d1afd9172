package pack

import (
	"errors"
	"io/fs"
	"path"
	"path/filepath"
	"strings"

	"github.com/modelpack/modelpack/artifact"

	"github.com/modelpack/modelpack/internal/beneath"
)

// tree is the model directory, opened once: the walk lists it and every file is later read from the same
// descriptor, through no symbolic link (package beneath), so a file or directory swapped for a link after the walk
// checked it is refused rather than followed out of the model.
type tree struct {
	root *beneath.Dir // the model directory or, for a Hub cache snapshot, the repository's cache directory
	// prefix is the model directory below root: "" or, in a Hub cache, "snapshots/COMMIT".
	prefix string
	// real is root's path with links resolved, to read absolute links that point inside it.
	real string
	// commit is the snapshot's commit in a Hub cache, whose files are links into root's blobs/ ("" elsewhere).
	commit string
	// only is the one file packed when Pack was given a file, not a directory (root is then its directory).
	only string
}

func (t *tree) Close() error { return t.root.Close() }

// openTree opens dir and, if it is a snapshot of a Hugging Face Hub cache (CACHE/models--ORG--NAME/snapshots/
// COMMIT), the repository's cache directory around it, from which the snapshot's links into blobs/ are read. The
// snapshot holds nothing but those links, so refusing them would make every cache unpackable, while following
// links anywhere else would let a model directory pull in files its owner did not put there.
func openTree(dir string) (*tree, error) {
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(dir)
	if err == nil {
		real, err = filepath.Abs(real)
	}
	if err != nil {
		return nil, badInput(dir, "%v", unwrapPathError(err))
	}
	if err := refuseHubCacheRoot(dir, real); err != nil {
		return nil, err
	}
	d, err := beneath.OpenDir(dir)
	if err != nil {
		return nil, badInput(dir, "%v", unwrapPathError(err))
	}
	if t := hubTree(d, real); t != nil {
		d.Close()
		return t, nil
	}
	return &tree{root: d, real: real}, nil
}

// hubTree opens the cache directory of the repository whose snapshot d is, or returns nil if d is none. It is the
// parent of d's parent as the descriptors see it, checked to hold d as snapshots/COMMIT, whatever was renamed
// since real was resolved.
func hubTree(d *beneath.Dir, real string) *tree {
	commit := filepath.Base(real)
	snapshots := filepath.Dir(real)
	if filepath.Base(snapshots) != "snapshots" || !isHubRepoDir(filepath.Base(filepath.Dir(snapshots))) || !isCommit(commit) {
		return nil
	}
	s, err := d.Parent()
	if err != nil {
		return nil
	}
	defer s.Close()
	repo, err := s.Parent()
	if err != nil {
		return nil
	}
	want, err1 := d.Stat()
	got, err2 := repo.Lstat("snapshots/" + commit)
	if err1 != nil || err2 != nil || got.Dev != want.Dev || got.Ino != want.Ino {
		repo.Close()
		return nil
	}
	return &tree{root: repo, prefix: "snapshots/" + commit, real: filepath.Dir(snapshots), commit: commit}
}

func isCommit(name string) bool {
	return len(name) == 40 && strings.Trim(name, "0123456789abcdef") == ""
}

// walk lists what the tree's model directory holds, refusing what cannot be packed: special files, symlinks
// leading out of it or to directories, unreadable files and directories. Hidden entries (".git", ".cache", …) and
// skip are left out. With more files to come (Options.Remote), an empty directory is no error. name gives a
// model-relative path as messages show it.
func (t *tree) walk(name func(rel string) string, skip map[string]bool, more bool) ([]node, error) {
	var nodes []node
	files := 0
	visit := func(e beneath.Entry) error {
		rel := e.Rel
		if t.only == "" && (strings.HasPrefix(path.Base(rel), ".") || skip[rel]) {
			return beneath.SkipDir
		}
		mode := e.Stat.Mode
		switch {
		case mode.IsDir():
			nodes = append(nodes, node{rel: rel, src: path.Join(t.prefix, rel), mode: mode.Perm(), dir: true, tree: t})
			return nil
		case mode&fs.ModeSymlink != 0:
			n, err := t.link(name, rel)
			if err != nil {
				return err
			}
			nodes = append(nodes, n)
		case mode.IsRegular():
			n, err := t.file(name, rel, path.Join(t.prefix, rel), e.Stat)
			if err != nil {
				return err
			}
			nodes = append(nodes, n)
		default:
			return badInput(name(rel), "%s; only regular files, directories and symlinks to files can be packed", beneath.Describe(mode))
		}
		files++
		return nil
	}
	var err error
	if t.only != "" {
		// A lone file: its directory's other entries are not the model's, so they are neither listed nor judged.
		var st beneath.Stat
		if st, err = t.root.Lstat(path.Join(t.prefix, t.only)); err == nil {
			err = visit(beneath.Entry{Rel: t.only, Stat: st})
		}
	} else {
		err = t.root.Walk(t.prefix, visit)
	}
	if err != nil {
		var ue *UserError
		var pe *fs.PathError
		switch {
		case errors.As(err, &ue):
			return nil, err
		case errors.As(err, &pe):
			return nil, badInput(pe.Path, "unreadable: %v", pe.Err)
		}
		return nil, err
	}
	if files == 0 && !more {
		return nil, badInput(name(""), "directory holds no files to pack")
	}
	return nodes, nil
}

// file opens the regular file at src (below the root), as listed, to record what a later read must find there.
func (t *tree) file(name func(string) string, rel, src string, listed beneath.Stat) (node, error) {
	f, err := t.root.Open(src)
	if errors.Is(err, beneath.ErrSymlink) || errors.Is(err, beneath.ErrNotRegular) {
		// Listed as a regular file, now a link or something else: replaced since the listing.
		return node{}, badInput(name(rel), "file changed since it was listed: it %v", unwrapPathError(err))
	}
	if err != nil {
		return node{}, badInput(name(rel), "unreadable: %v", unwrapPathError(err))
	}
	defer f.Close()
	if err := f.Same(listed); err != nil {
		return node{}, badInput(name(rel), "%v", unwrapPathError(err))
	}
	st := f.Opened()
	return node{rel: rel, src: src, mode: st.Mode.Perm(), size: st.Size, tree: t, stat: st}, nil
}

// link resolves the symlink at rel by reading it: it is packed as the file it points to when that is a regular
// file in the model directory, or in a Hub cache's blobs/, reached through no further link.
func (t *tree) link(name func(string) string, rel string) (node, error) {
	at := path.Join(t.prefix, rel)
	target, err := t.root.Readlink(at)
	if errors.Is(err, beneath.ErrChanged) {
		return node{}, badInput(name(rel), "%v", unwrapPathError(err))
	}
	if err != nil {
		return node{}, badInput(name(rel), "unreadable: %v", unwrapPathError(err))
	}
	src, ok := t.resolve(at, target)
	if !ok {
		shown := target
		if !filepath.IsAbs(shown) {
			shown = filepath.Join(t.real, filepath.FromSlash(path.Dir(at)), shown)
		}
		return node{}, badInput(name(rel), "symlink points outside the model directory (to %s)", shown)
	}
	st, err := t.root.Lstat(src)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return node{}, badInput(name(rel), "broken symlink: %s does not exist", target)
	case errors.Is(err, beneath.ErrSymlink):
		return node{}, badInput(name(rel), "symlink through another symlink (to %s): only a link straight to a file of the model is followed", target)
	case err != nil:
		return node{}, badInput(name(rel), "unreadable: %v", unwrapPathError(err))
	case st.Mode&fs.ModeSymlink != 0:
		return node{}, badInput(name(rel), "symlink to a symlink (%s): only a link straight to a file of the model is followed", target)
	case st.Mode.IsDir():
		return node{}, badInput(name(rel), "symlink to a directory; only symlinks to files can be packed")
	case !st.Mode.IsRegular():
		return node{}, badInput(name(rel), "symlink to something that %s; only symlinks to files can be packed", beneath.Describe(st.Mode))
	}
	return t.file(name, rel, src, st)
}

// resolve is the path below the root a link at `at` (below the root) with this target names, if it may be
// followed: into the model directory, or from a Hub cache snapshot into blobs/.
func (t *tree) resolve(at, target string) (string, bool) {
	if filepath.IsAbs(target) {
		r, err := filepath.Rel(t.real, target)
		if err != nil || !filepath.IsLocal(r) {
			return "", false
		}
		target = filepath.ToSlash(r)
	} else {
		target = path.Join(path.Dir(at), target)
	}
	target = path.Clean(target)
	if !beneath.Local(target) || target == "." {
		return "", false
	}
	if t.prefix == "" || within(t.prefix, target) {
		return target, true
	}
	return target, t.commit != "" && within("blobs", target)
}

// chooseFiles keeps the files the ignore file does not ignore, include admits and exclude does not
// (artifact.MatchInclude: a matching directory stands for everything under it), and the directories that still
// hold a kept file. A choice that keeps nothing is an error naming the globs, before any blob is written.
func chooseFiles(nodes []node, ig *ignoreFile, include, exclude []string, name func(string) string) ([]node, error) {
	if len(include)+len(exclude) == 0 && ig == nil {
		return nodes, nil
	}
	kept := map[string]bool{}
	var files []node
	for _, n := range nodes {
		if n.dir || ig.ignores(n.rel) || (len(include) > 0 && !artifact.MatchInclude(include, n.rel)) || artifact.MatchInclude(exclude, n.rel) {
			continue
		}
		files = append(files, n)
		kept[n.rel] = true
		for d := path.Dir(n.rel); d != "." && !kept[d]; d = path.Dir(d) {
			kept[d] = true
		}
	}
	if len(files) == 0 {
		if ig != nil {
			return nil, badInput(name(""), "%s with --include %q --exclude %q leaves no file to pack", ig.name, include, exclude)
		}
		return nil, badInput(name(""), "--include %q --exclude %q leave no file to pack", include, exclude)
	}
	var out []node
	for _, n := range nodes {
		if kept[n.rel] {
			out = append(out, n)
		}
	}
	return out, nil
}
