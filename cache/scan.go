package cache

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	digest "github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/scan"
)

// Every blob of a model is scanned once on the node (package scan: what loading each file would run) and its
// report kept with the blob's record, so the check of every publish, warm ones included, is a lookup. Blob bytes
// are verified before they are scanned, and a report is kept only for the scanner version that made it.

// scanRecord is a blob's report as stored.
type scanRecord struct {
	Version string      `json:"version"`
	Report  scan.Report `json:"report"`
}

// ScannedLayer is the scan of one layer of a manifest: a raw layer is one file of the model (Path); a tar
// layer's findings name the files in it.
type ScannedLayer struct {
	artifact.Layer
	Report scan.Report
}

// Scan returns the scan report of every layer of the complete manifest d (or the manifest the index d chose),
// scanning those not scanned yet (by this scanner version). A layer listed twice is reported once.
func (c *Cache) Scan(d digest.Digest) ([]ScannedLayer, error) {
	rec, ok := c.completeRecord(d)
	if !ok {
		return nil, fmt.Errorf("manifest %s: %w (pull it first)", d, ErrNotFound)
	}
	seen := map[digest.Digest]bool{}
	var out []ScannedLayer
	for _, l := range rec.Layers {
		if seen[l.Digest] {
			continue
		}
		seen[l.Digest] = true
		r, err := c.scanBlob(l.Digest, l.Size)
		if err != nil {
			return nil, fmt.Errorf("scan layer %s: %w", l.Digest, err)
		}
		out = append(out, ScannedLayer{Layer: l, Report: r})
	}
	return out, nil
}

func (c *Cache) scanBlob(d digest.Digest, size int64) (scan.Report, error) {
	var rec scanRecord
	found := false
	if err := c.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketScans).Get([]byte(d))
		if b == nil {
			return nil
		}
		found = json.Unmarshal(b, &rec) == nil && rec.Version == scan.Version
		return nil
	}); err != nil {
		return scan.Report{}, err
	}
	if found {
		c.m.scans.WithLabelValues("cached").Inc()
		return rec.Report, nil
	}
	f, err := c.blobs.Open(d)
	if err != nil {
		return scan.Report{}, err
	}
	defer f.Close()
	lim := scan.DefaultLimits
	lim.SpoolDir = filepath.Join(c.root, "tmp") // what a compressed member inflates to stays under the root
	rec = scanRecord{Version: scan.Version, Report: lim.File(f, size)}
	c.m.scans.WithLabelValues(string(rec.Report.Verdict)).Inc()
	return rec.Report, c.db.Update(func(tx *bolt.Tx) error {
		return putJSON(tx.Bucket(bucketScans), string(d), rec)
	})
}

// forgetScans drops the reports of blobs no longer kept.
func (c *Cache) forgetScans(keep func(digest.Digest) bool) error {
	return c.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketScans)
		var gone [][]byte
		err := b.ForEach(func(k, _ []byte) error {
			if !keep(digest.Digest(k)) {
				gone = append(gone, append([]byte(nil), k...))
			}
			return nil
		})
		for _, k := range gone {
			if err == nil {
				err = b.Delete(k)
			}
		}
		return err
	})
}
