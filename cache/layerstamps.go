package cache

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	digest "github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/cas"
)

// Stamps of extracted files. A tar layer's files are copies of its blob's contents, and views hardlink them as
// they hardlink raw blobs: a write into one (through the layer or through a view) is a write no blob stamp sees.
// Each extraction therefore records the stamp of every regular file it wrote (bucketLayerStamps), and every
// Acquire compares them with a stat per file of the layers it uses. A changed file makes the whole layer suspect:
// it is deleted with the views built from it and extracted again from its blob (checked first), so the new view
// holds the blob's bytes. Links and unlinks of extracted files by the cache (views built and deleted) carry the
// stamps over, as cas does for blobs.

// layerStamps are one extraction's file stamps, by path inside the layer; dir identifies the extraction (its
// directory's inode and ctime: an inode number is reused), so that stamps of a deleted extraction are never taken
// for those of the next.
type layerStamps struct {
	dir    [3]int64
	files  map[string]cas.Stamp
	inodes map[[2]uint64]string
}

// stampTree stamps every regular file under dir.
func stampTree(dir string) (map[string]cas.Stamp, error) {
	out := map[string]cas.Stamp{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		out[filepath.ToSlash(rel)] = cas.StampOf(info)
		return nil
	})
	return out, err
}

func dirID(dir string) ([3]int64, bool) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return [3]int64{}, false
	}
	st := cas.StampOf(fi)
	return [3]int64{int64(st.Dev), int64(st.Ino), st.Ctime}, true
}

// layerStampsLocked returns the stamps of the extraction now at layer d's directory, loading them (or, for an
// extraction recorded without them, taking them now). The caller holds layerMu.
func (c *Cache) layerStampsLocked(d digest.Digest) (*layerStamps, bool) {
	id, ok := dirID(c.layerDir(d))
	if !ok {
		return nil, false
	}
	if ls := c.lstamps[d]; ls != nil && ls.dir == id {
		return ls, true
	}
	var files map[string]cas.Stamp
	c.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketLayerStamps).Get([]byte(d)); b != nil {
			json.Unmarshal(b, &files)
		}
		return nil
	})
	if files == nil {
		// Extracted by an older version: what is there now is all there is to compare with later.
		var err error
		if files, err = stampTree(c.layerDir(d)); err != nil {
			return nil, false
		}
		c.saveLayerStamps(map[digest.Digest]map[string]cas.Stamp{d: files})
	}
	ls := &layerStamps{dir: id, files: files, inodes: map[[2]uint64]string{}}
	for rel, st := range files {
		ls.inodes[[2]uint64{st.Dev, st.Ino}] = rel
	}
	c.lstamps[d] = ls
	return ls, true
}

// saveLayerStamps writes layers' stamps in one transaction.
func (c *Cache) saveLayerStamps(layers map[digest.Digest]map[string]cas.Stamp) error {
	if len(layers) == 0 {
		return nil
	}
	return c.db.Update(func(tx *bolt.Tx) error {
		for d, files := range layers {
			if err := putJSON(tx.Bucket(bucketLayerStamps), string(d), files); err != nil {
				return err
			}
		}
		return nil
	})
}

// damagedLayers stats every file of the extracted tar layers rec's view sel uses and returns the layers with a
// file whose stamp changed (or that is gone).
func (c *Cache) damagedLayers(rec *manifestRecord, sel Selector) []digest.Digest {
	c.layerMu.Lock()
	defer c.layerMu.Unlock()
	var bad []digest.Digest
	for _, l := range rec.Layers {
		if l.Format == artifact.FormatRaw || !sel.layer(l) {
			continue
		}
		ls, ok := c.layerStampsLocked(l.Digest)
		if !ok {
			continue // not extracted: the view extracts it
		}
		for rel, st := range ls.files {
			fi, err := os.Lstat(filepath.Join(c.layerDir(l.Digest), filepath.FromSlash(rel)))
			if err != nil || cas.StampOf(fi) != st {
				bad = append(bad, l.Digest)
				break
			}
		}
	}
	return bad
}

// dropLayers deletes extracted layers found changed, and every view built from them (a volume still mounting one
// loses those files rather than reading them); the next view extracts them again from their blobs.
func (c *Cache) dropLayers(layers []digest.Digest) error {
	c.mu.Lock()
	var affected []digest.Digest
	err := c.db.Update(func(tx *bolt.Tx) error {
		ms, err := allManifests(tx)
		if err != nil {
			return err
		}
		for _, m := range ms {
			for _, l := range m.Layers {
				if containsDigest(layers, l.Digest) {
					affected = append(affected, m.Descriptor.Digest)
					break
				}
			}
		}
		for _, d := range layers {
			for _, b := range [][]byte{bucketLayers, bucketDurableLayers, bucketLayerStamps} {
				if err := tx.Bucket(b).Delete([]byte(d)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	var errs []error
	c.layerMu.Lock()
	for _, d := range layers {
		delete(c.lstamps, d)
	}
	c.layerMu.Unlock()
	for _, d := range layers {
		c.m.corruptBlobs.WithLabelValues("extracted").Inc()
		c.log.Error("extracted layer was changed on disk: deleted with its views, it is extracted again from its blob", "layer", d.String())
		errs = append(errs, c.trash(c.layerDir(d)))
	}
	errs = append(errs, c.trashViews(affected))
	c.mu.Unlock()
	return errors.Join(append(errs, err, c.emptyTrash())...)
}

func containsDigest(ds []digest.Digest, d digest.Digest) bool {
	for _, x := range ds {
		if x == d {
			return true
		}
	}
	return false
}

// extractedFile splits the path of a file of an extracted layer into its layer and its path inside it.
func (c *Cache) extractedFile(p string) (digest.Digest, string, bool) {
	rel, err := filepath.Rel(filepath.Join(c.root, "layers", "sha256"), p)
	if err != nil || strings.HasPrefix(rel, "..") {
		return "", "", false
	}
	hex, inner, ok := strings.Cut(filepath.ToSlash(rel), "/")
	d := digest.NewDigestFromEncoded(digest.SHA256, hex)
	return d, inner, ok && d.Validate() == nil
}

// relinkExtractedLocked runs op, which changes the link count of the extracted file of layer d at rel, and records
// the file's new stamp (in changed, for the caller to save) if the old one matched right before. ls is the
// layer's stamps (nil if it has none). The caller holds layerMu.
func (c *Cache) relinkExtractedLocked(ls *layerStamps, d digest.Digest, rel string, op func() error, changed map[digest.Digest]map[string]cas.Stamp) error {
	p := filepath.Join(c.layerDir(d), filepath.FromSlash(rel))
	fi, err := os.Lstat(p)
	carry := ls != nil && err == nil && ls.files[rel] == cas.StampOf(fi)
	if err := op(); err != nil {
		return err
	}
	if !carry {
		return nil
	}
	if fi, err = os.Lstat(p); err == nil {
		st := cas.StampOf(fi)
		ls.files[rel] = st
		if changed[d] == nil {
			changed[d] = ls.files
		}
	}
	return nil
}

// unlinkExtracted unlinks files that may be hardlinks of extracted files (of views being deleted), carrying the
// stamps of those over.
func (c *Cache) unlinkExtracted(paths []string) error {
	if len(paths) == 0 {
		return nil
	}
	c.layerMu.Lock()
	defer c.layerMu.Unlock()
	type file struct {
		layer digest.Digest
		rel   string
		ls    *layerStamps
	}
	byInode := map[[2]uint64]file{}
	var layers []digest.Digest
	c.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketLayerStamps).ForEach(func(k, _ []byte) error {
			layers = append(layers, digest.Digest(k))
			return nil
		})
	})
	for _, d := range layers {
		if ls, ok := c.layerStampsLocked(d); ok {
			for ino, rel := range ls.inodes {
				byInode[ino] = file{d, rel, ls}
			}
		}
	}
	changed := map[digest.Digest]map[string]cas.Stamp{}
	var errs []error
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		st := cas.StampOf(fi)
		f, ok := byInode[[2]uint64{st.Dev, st.Ino}]
		if !ok {
			continue // removeAll deletes it
		}
		errs = append(errs, c.relinkExtractedLocked(f.ls, f.layer, f.rel, func() error { return os.Remove(p) }, changed))
	}
	return errors.Join(append(errs, c.saveLayerStamps(changed))...)
}
