package cache

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/archive"
	"github.com/modelpack/modelpack/cas"
)

// Selector narrows a view. The zero Selector is the whole artifact.
type Selector struct {
	// Kinds keeps only layers of these kinds (weight, weight.config, doc, code, dataset). Container-image layers
	// have no kind and are kept only when Kinds is empty.
	Kinds []artifact.Kind `json:"kinds,omitempty"`
	// Include keeps only files whose model-relative path matches one of these globs (artifact.MatchInclude):
	// path.Match syntax per component, "**" matches any number of components ("**/*.json", "tokenizer/**"), a
	// glob without "/" matches a name at any depth, and a glob that matches a directory keeps everything under it.
	Include []string `json:"include,omitempty"`
}

// IsZero reports whether the selector keeps everything.
func (s Selector) IsZero() bool { return len(s.Kinds) == 0 && len(s.Include) == 0 }

// Validate checks kinds and glob syntax.
func (s Selector) Validate() error {
	for _, k := range s.Kinds {
		// Callers parse what people type (aliases included); a selector holds the spec's names, which layers
		// carry, so an alias here would select nothing.
		if got, err := artifact.ParseKind(string(k)); err != nil {
			return err
		} else if got != k {
			return fmt.Errorf("kind %q: use the spec's name %q", k, got)
		}
	}
	for _, g := range s.Include {
		if err := artifact.ValidateGlob(g); err != nil {
			return err
		}
	}
	return nil
}

// canonical sorts and deduplicates, so equal selectors share a view.
func (s Selector) canonical() Selector {
	var out Selector
	for _, k := range s.Kinds {
		if !slices.Contains(out.Kinds, k) {
			out.Kinds = append(out.Kinds, k)
		}
	}
	for _, g := range s.Include {
		if !slices.Contains(out.Include, g) {
			out.Include = append(out.Include, g)
		}
	}
	slices.Sort(out.Kinds)
	slices.Sort(out.Include)
	return out
}

// viewKey names the view directory: the manifest's hex, plus a hash of a non-empty selector.
func viewKey(m digest.Digest, s Selector) string {
	s = s.canonical()
	if s.IsZero() {
		return m.Encoded()
	}
	var kinds []string
	for _, k := range s.Kinds {
		kinds = append(kinds, string(k))
	}
	// "include2": globs without "/" match at any depth since the CLI and volumes share one rule; views built under
	// the old rule get other names and age out instead of being served for the new one.
	h := sha256.Sum256([]byte("include2\x00" + strings.Join(kinds, ",") + "\x00" + strings.Join(s.Include, "\x00")))
	return m.Encoded() + "-" + hex.EncodeToString(h[:8])
}

func (s Selector) layer(l artifact.Layer) bool {
	return len(s.Kinds) == 0 || slices.Contains(s.Kinds, l.Kind)
}

// file reports whether p is kept: it, or one of its parent directories, matches a glob (artifact.MatchInclude, the
// rule the CLI's --include follows too).
func (s Selector) file(p string) bool {
	return len(s.Include) == 0 || artifact.MatchInclude(s.Include, p)
}

// Acquire returns the read-only view of manifest (a manifest or index digest in the cache) narrowed by sel, building
// it on first use, and records that owner uses it. The view stays until every owner has released it and GC
// evicts the manifest. An owner holds one reference: acquiring again moves it.
func (c *Cache) Acquire(owner string, manifest digest.Digest, sel Selector) (string, error) {
	if owner == "" {
		return "", errors.New("acquire: empty owner")
	}
	if err := sel.Validate(); err != nil {
		return "", err
	}
	sel = sel.canonical()
	start := time.Now()
	// Never a view of blobs that are missing or of the wrong size (this also takes them out of use).
	rec, ok := c.completeRecord(manifest)
	if !ok {
		return "", fmt.Errorf("manifest %s: %w (pull it first)", manifest, ErrNotFound)
	}
	// Nor of extracted files changed since their extraction: their layers are extracted again.
	if bad := c.damagedLayers(rec, sel); len(bad) > 0 {
		if err := c.dropLayers(bad); err != nil {
			return "", err
		}
	}
	run(&c.hooks.acquire, func(f func(string)) { f("checked") })
	var md digest.Digest
	var prev []byte
	// Resolve and record the reference in one step under mu, so GC cannot evict the manifest in between. Only
	// the small state record is read and written: the manifest itself is read only to build a missing view.
	// tx is meta.db's; holds is that of the database of owner's reference (tx itself for a durable owner).
	record := func(tx, holds *bolt.Tx) error {
		var err error
		if md, err = resolveDigest(tx, manifest); err != nil {
			return err
		}
		st, ok, err := stateOf(tx, md)
		if err != nil {
			return err
		}
		if !ok || !st.Complete {
			return fmt.Errorf("manifest %s: %w (pull it first)", manifest, ErrNotFound)
		}
		refs := holds.Bucket(bucketRefs)
		if old := refs.Get([]byte(owner)); old != nil {
			prev = append([]byte(nil), old...)
		}
		if holds == tx {
			st.LastUsed = time.Now()
			err = putJSON(tx.Bucket(bucketState), string(md), st)
		} else {
			err = putJSON(holds.Bucket(bucketHoldUse), string(md), time.Now())
		}
		if err != nil {
			return err
		}
		return putJSON(refs, owner, refRecord{Manifest: md, Selector: sel, View: viewKey(md, sel), Since: time.Now()})
	}
	c.mu.Lock()
	var err error
	if c.volatile(owner) {
		// meta.db is only read: the warm publish of a volume waits for no flush to disk (holds.go).
		err = c.db.View(func(tx *bolt.Tx) error {
			return c.holds.Update(func(holds *bolt.Tx) error { return record(tx, holds) })
		})
	} else {
		err = c.db.Update(func(tx *bolt.Tx) error { return record(tx, tx) })
	}
	c.mu.Unlock()
	if err != nil {
		return "", err
	}
	run(&c.hooks.acquire, func(f func(string)) { f("recorded") })
	dir, err := c.ensureView(md, sel)
	if err != nil {
		// Put the owner's previous reference back (or drop the new one).
		c.refsDB(owner).Update(func(tx *bolt.Tx) error {
			if prev != nil {
				return tx.Bucket(bucketRefs).Put([]byte(owner), prev)
			}
			return tx.Bucket(bucketRefs).Delete([]byte(owner))
		})
		return "", err
	}
	c.m.acquires.Inc()
	c.m.acquireSeconds.Observe(time.Since(start).Seconds())
	return dir, nil
}

// Release drops owner's reference. Releasing an unknown owner is not an error.
func (c *Cache) Release(owner string) error {
	return c.refsDB(owner).Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRefs).Delete([]byte(owner))
	})
}

// ensureView returns the view directory, building it once. The caller holds a reference on the manifest.
func (c *Cache) ensureView(md digest.Digest, sel Selector) (string, error) {
	key := viewKey(md, sel)
	dir := c.viewDir(key)
	if _, err := os.Lstat(dir); err == nil {
		return dir, nil
	}
	_, err, _ := c.viewFlight.Do(key, func() (any, error) {
		if _, err := os.Lstat(dir); err == nil {
			return nil, nil
		}
		var rec *manifestRecord
		if err := c.db.View(func(tx *bolt.Tx) error {
			var err error
			rec, err = c.manifest(tx, md)
			return err
		}); err != nil {
			return nil, err
		}
		if rec == nil {
			return nil, fmt.Errorf("manifest %s: %w", md, ErrNotFound)
		}
		return nil, c.buildView(rec, sel, dir)
	})
	return dir, err
}

// node is one entry of a view being assembled: layers are merged into this tree, then it is materialised.
type node struct {
	mode     fs.FileMode   // type and permission bits
	src      string        // file to hardlink, for regular files
	target   string        // for symlinks
	layer    int           // index of the layer that put it here
	from     digest.Digest // that layer's digest (two layers of a model may not claim one path)
	blob     digest.Digest // the blob src is, for a raw layer's file: linked through cas, which keeps its stamp
	children map[string]*node
}

func newDir(mode fs.FileMode, layer int) *node {
	return &node{mode: fs.ModeDir | mode.Perm(), layer: layer, children: map[string]*node{}}
}

// buildView merges the selected layers, bottom to top, applying whiteouts, and hardlinks the result into a
// temporary directory that is renamed to dir. It costs one link per file whatever the files' sizes.
func (c *Cache) buildView(rec *manifestRecord, sel Selector, dir string) error {
	start := time.Now()
	root := newDir(0o555, -1)
	for i, l := range rec.Layers {
		if !sel.layer(l) {
			continue
		}
		var err error
		if l.Format == artifact.FormatRaw {
			err = root.put(l.Path, &node{mode: 0o444, src: c.blobs.Path(l.Digest), layer: i, from: l.Digest, blob: l.Digest}, !rec.Image)
		} else if err = c.ensureLayer(c.ctx, l); err != nil {
			return err
		} else {
			err = root.mergeLayer(c.layerDir(l.Digest), i, l.Digest, rec.Image)
		}
		var lc *layerConflict
		if errors.As(err, &lc) {
			lower := rec.Layers[lc.lower]
			return fmt.Errorf("%w: layer %d (%s, %s) and layer %d (%s, %s): %s", artifact.ErrPathConflict,
				lc.lower, lower.Digest, layerName(lower), i, l.Digest, layerName(l), lc)
		}
		if err != nil {
			return fmt.Errorf("layer %s: %w", l.Digest, err)
		}
	}
	if len(sel.Include) > 0 {
		root.prune("", sel)
	}
	tmp, err := c.tempDir("view-" + filepath.Base(dir))
	if err != nil {
		return err
	}
	// Links change the ctimes of the files they link: their stamps are carried over (layerstamps.go).
	changed := map[digest.Digest]map[string]cas.Stamp{}
	loaded := map[digest.Digest]*layerStamps{}
	c.layerMu.Lock()
	files, err := root.materialize(tmp, rec.Image, func(n *node, dst string) error {
		if n.blob != "" {
			return c.blobs.Link(n.blob, dst)
		}
		if d, rel, ok := c.extractedFile(n.src); ok {
			ls, seen := loaded[d]
			if !seen {
				ls, _ = c.layerStampsLocked(d)
				loaded[d] = ls
			}
			return c.relinkExtractedLocked(ls, d, rel, func() error { return os.Link(n.src, dst) }, changed)
		}
		return os.Link(n.src, dst)
	})
	if serr := c.saveLayerStamps(changed); err == nil {
		err = serr
	}
	c.layerMu.Unlock()
	if err == nil {
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		removeAll(tmp)
		return fmt.Errorf("build view of %s: %w", rec.Descriptor.Digest, err)
	}
	// The root is made read-only only now: moving a directory to another parent needs write access to it.
	if err := os.Chmod(dir, 0o555); err != nil {
		return err
	}
	c.m.viewBuilds.Inc()
	c.m.viewFiles.Add(float64(files))
	c.m.viewSeconds.Observe(time.Since(start).Seconds())
	return nil
}

// put places n at path p, creating parent directories. In a container image an upper layer replaces what a lower
// one had there, as overlayfs does. In a model no two layers may claim one path (the same blob listed twice
// aside), whether a file of two layers or a file where another layer has a directory: which one wins would
// depend on the order of the layers, so put refuses it, as Layers refuses two raw layers at one path.
func (root *node) put(p string, n *node, model bool) error {
	parts := strings.Split(p, "/")
	d := root
	for i, part := range parts[:len(parts)-1] {
		child := d.children[part]
		if child != nil && !child.mode.IsDir() && model && child.from != n.from {
			return &layerConflict{path: strings.Join(parts[:i+1], "/"), lower: child.layer, why: "is a file there, and the other needs a directory"}
		}
		if child == nil || !child.mode.IsDir() {
			// Missing, or a file of a lower layer that this layer turns into a directory (as overlayfs does).
			child = newDir(0o555, n.layer)
			child.from = n.from
			d.children[part] = child
		}
		d = child
	}
	name := parts[len(parts)-1]
	old := d.children[name]
	if old != nil && old.mode.IsDir() && n.mode.IsDir() {
		// Directory over directory: the upper one's mode, both one's contents.
		old.mode, old.layer = n.mode, n.layer
		return nil
	}
	if old != nil && model && old.from != n.from {
		why := "both hold that file"
		if old.mode.IsDir() || n.mode.IsDir() {
			why = "put a file and a directory there"
		}
		return &layerConflict{path: p, lower: old.layer, why: why}
	}
	d.children[name] = n
	return nil
}

// layerConflict is a path two layers of a model claim; the caller names the layers.
type layerConflict struct {
	path  string
	lower int // the layer that claimed it first
	why   string
}

func (e *layerConflict) Error() string { return fmt.Sprintf("%q: %s", e.path, e.why) }

func (root *node) lookup(p string) *node {
	d := root
	if p == "." || p == "" {
		return d
	}
	for _, part := range strings.Split(p, "/") {
		if d = d.children[part]; d == nil || !d.mode.IsDir() {
			return nil
		}
	}
	return d
}

// mergeLayer adds an extracted layer: whiteout markers delete what lower layers put at their path, an opaque
// marker empties its directory of lower layers' entries, everything else replaces what is below it. Absolute
// symlinks are for images only: a layer extracted for an image and reused, by digest, in a model is refused.
func (root *node) mergeLayer(dir string, layer int, blob digest.Digest, image bool) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		base := path.Base(rel)
		if strings.HasPrefix(base, archive.WhiteoutPrefix) {
			parent := root.lookup(path.Dir(rel))
			if parent == nil {
				return nil
			}
			if base == archive.WhiteoutOpaque {
				for name, child := range parent.children {
					if child.layer < layer {
						delete(parent.children, name)
					}
				}
				return nil
			}
			name := strings.TrimPrefix(base, archive.WhiteoutPrefix)
			if child := parent.children[name]; child != nil && child.layer < layer {
				delete(parent.children, name)
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			n := newDir(info.Mode(), layer)
			n.from = blob
			return root.put(rel, n, !image)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if !image && path.IsAbs(target) {
				return fmt.Errorf("%w: symlink %q -> %q is absolute", archive.ErrLinkEscape, rel, target)
			}
			return root.put(rel, &node{mode: fs.ModeSymlink | 0o777, target: target, layer: layer, from: blob}, !image)
		case d.Type().IsRegular():
			return root.put(rel, &node{mode: info.Mode().Perm(), src: p, layer: layer, from: blob}, !image)
		}
		return fmt.Errorf("%w: %s in an extracted layer", archive.ErrSpecialFile, rel)
	})
}

// layerName is how a conflict names a layer: its path in the model, or its media type.
func layerName(l artifact.Layer) string {
	if l.Path != "" {
		return "path " + strconv.Quote(l.Path)
	}
	return l.MediaType
}

// prune drops files no glob keeps and directories left empty by that; it reports whether n keeps anything.
func (n *node) prune(p string, sel Selector) bool {
	for name, child := range n.children {
		cp := path.Join(p, name)
		if sel.file(cp) {
			continue // kept whole, directory or not
		}
		if child.mode.IsDir() && child.prune(cp, sel) {
			continue
		}
		delete(n.children, name)
	}
	return len(n.children) > 0
}

// materialize creates the tree under dir (which exists) and returns the number of files linked. Directories are
// read-only; a model's are also open to every user, an image's keep their permissions.
func (n *node) materialize(dir string, image bool, link func(n *node, dst string) error) (int, error) {
	names := make([]string, 0, len(n.children))
	for name := range n.children {
		names = append(names, name)
	}
	sort.Strings(names)
	files := 0
	for _, name := range names {
		child, p := n.children[name], filepath.Join(dir, name)
		switch {
		case child.mode.IsDir():
			if err := os.Mkdir(p, 0o755); err != nil {
				return files, err
			}
			k, err := child.materialize(p, image, link)
			files += k
			if err != nil {
				return files, err
			}
			mode := child.mode.Perm()
			if !image {
				mode |= 0o555
			}
			if err := os.Chmod(p, mode&^0o222); err != nil {
				return files, err
			}
		case child.mode&fs.ModeSymlink != 0:
			if err := os.Symlink(child.target, p); err != nil {
				return files, err
			}
		default:
			if err := link(child, p); err != nil {
				return files, fmt.Errorf("link %s: %w", name, err)
			}
			files++
		}
	}
	return files, nil
}
