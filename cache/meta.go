package cache

import (
	"encoding/json"
	"io/fs"
	"syscall"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	bolt "go.etcd.io/bbolt"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/internal/schema"
)

// Metadata lives in bbolt buckets of JSON records, written in transactions so a crash leaves either the old or the
// new state. Directories are not recorded here: a view or layer directory under its final name is complete by
// construction (it was renamed into place).
var (
	bucketManifests = []byte("manifests") // manifest digest -> manifestRecord
	bucketIndexes   = []byte("indexes")   // index digest -> indexRecord (the manifest chosen for this node)
	bucketRefs      = []byte("refs")      // owner -> refRecord
	bucketLayers    = []byte("layers")    // layer digest -> archive.Stats of its extraction
	// bucketState holds the small, often-written part of a manifest's record, so that an Acquire or a cache hit
	// does not rewrite a manifest of thousands of layers.
	bucketState = []byte("state") // manifest digest -> manifestState
	// bucketDurableLayers marks the extracted layers whose files reached the disk (a background syncfs completed);
	// after a restart of the machine, an extracted layer without the mark is deleted and extracted again.
	bucketDurableLayers = []byte("durableLayers") // layer digest -> empty
	// bucketLayerStamps holds the stamp of every regular file of each extracted layer (layerstamps.go).
	bucketLayerStamps = []byte("layerStamps") // layer digest -> {path: cas.Stamp}
	// bucketScans holds each blob's scan report (package scan), with the scanner's version that made it.
	bucketScans = []byte("scans") // blob digest -> scanRecord
)

// metaSchema is meta.db's layout history. Version 1 is the buckets above as releases before versioning wrote them
// (creating those an older one lacked); a change of layout is a new migration appended here.
var metaSchema = schema.Schema{Migrations: []schema.Migration{
	schema.CreateBuckets(bucketManifests, bucketIndexes, bucketRefs, bucketLayers, bucketState, bucketDurableLayers, bucketLayerStamps, bucketScans),
}}

type manifestRecord struct {
	Descriptor ocispec.Descriptor `json:"descriptor"` // the manifest itself (media type, digest, size, platform)
	Name       string             `json:"name,omitempty"`
	Config     ocispec.Descriptor `json:"config"`
	Layers     []artifact.Layer   `json:"layers"`
	Image      bool               `json:"image"`
	// From is the index the manifest was chosen from, if any: needed until the pull records it in bucketIndexes.
	From     *ocispec.Descriptor `json:"from,omitempty"`
	PulledAt time.Time           `json:"pulledAt"`
	// Complete and LastUsed live in bucketState.
	Complete bool      `json:"-"`
	LastUsed time.Time `json:"-"`
}

type manifestState struct {
	Descriptor ocispec.Descriptor `json:"descriptor"`
	Complete   bool               `json:"complete"`
	LastUsed   time.Time          `json:"lastUsed"`
}

// blobs lists every blob the manifest needs, itself included.
func (r *manifestRecord) blobs() []ocispec.Descriptor {
	out := []ocispec.Descriptor{r.Descriptor, r.Config}
	if r.From != nil {
		out = append(out, *r.From)
	}
	for _, l := range r.Layers {
		out = append(out, l.Descriptor)
	}
	return out
}

type indexRecord struct {
	Descriptor ocispec.Descriptor `json:"descriptor"`
	Manifest   digest.Digest      `json:"manifest"`
}

type refRecord struct {
	Manifest digest.Digest `json:"manifest"`
	Selector Selector      `json:"selector"`
	View     string        `json:"view"`
	Since    time.Time     `json:"since"`
}

func putJSON(b *bolt.Bucket, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put([]byte(key), data)
}

// getJSON decodes the record at key into v and reports whether it was there.
func getJSON(b *bolt.Bucket, key string, v any) (bool, error) {
	data := b.Get([]byte(key))
	if data == nil {
		return false, nil
	}
	return true, json.Unmarshal(data, v)
}

func (c *Cache) manifest(tx *bolt.Tx, d digest.Digest) (*manifestRecord, error) {
	var r manifestRecord
	ok, err := getJSON(tx.Bucket(bucketManifests), string(d), &r)
	if err != nil || !ok {
		return nil, err
	}
	return &r, loadState(tx, &r)
}

func loadState(tx *bolt.Tx, r *manifestRecord) error {
	st, _, err := stateOf(tx, r.Descriptor.Digest)
	r.Complete, r.LastUsed = st.Complete, st.LastUsed
	return err
}

func stateOf(tx *bolt.Tx, d digest.Digest) (manifestState, bool, error) {
	var st manifestState
	ok, err := getJSON(tx.Bucket(bucketState), string(d), &st)
	return st, ok, err
}

// putManifest writes a manifest's record and its state.
func putManifest(tx *bolt.Tx, r *manifestRecord) error {
	if err := putJSON(tx.Bucket(bucketManifests), string(r.Descriptor.Digest), r); err != nil {
		return err
	}
	return putJSON(tx.Bucket(bucketState), string(r.Descriptor.Digest), manifestState{r.Descriptor, r.Complete, r.LastUsed})
}

func deleteManifest(tx *bolt.Tx, d digest.Digest) error {
	if err := tx.Bucket(bucketManifests).Delete([]byte(d)); err != nil {
		return err
	}
	return tx.Bucket(bucketState).Delete([]byte(d))
}

// resolveDigest maps an index digest to the manifest chosen from it; other digests map to themselves.
func resolveDigest(tx *bolt.Tx, d digest.Digest) (digest.Digest, error) {
	var ix indexRecord
	ok, err := getJSON(tx.Bucket(bucketIndexes), string(d), &ix)
	if ok {
		d = ix.Manifest
	}
	return d, err
}

func allManifests(tx *bolt.Tx) ([]*manifestRecord, error) {
	var out []*manifestRecord
	err := tx.Bucket(bucketManifests).ForEach(func(_, v []byte) error {
		var r manifestRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		out = append(out, &r)
		return loadState(tx, &r)
	})
	return out, err
}

func allRefs(tx *bolt.Tx) (map[string]refRecord, error) {
	out := map[string]refRecord{}
	err := tx.Bucket(bucketRefs).ForEach(func(k, v []byte) error {
		var r refRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		out[string(k)] = r
		return nil
	})
	return out, err
}

func inode(info fs.FileInfo) (uint64, bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Ino, true
}

func linkCount(info fs.FileInfo) uint64 {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return 1
	}
	return uint64(st.Nlink)
}

// deleteLayerRecords forgets the extracted layer d: its record, its durability mark and its stamps.
func deleteLayerRecords(tx *bolt.Tx, d digest.Digest) error {
	for _, b := range [][]byte{bucketLayers, bucketDurableLayers, bucketLayerStamps} {
		if err := tx.Bucket(b).Delete([]byte(d)); err != nil {
			return err
		}
	}
	return nil
}
