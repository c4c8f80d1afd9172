package cache

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/modelpack/modelpack/internal/schema"
)

// A meta.db and a holds file as releases before schema versions wrote them (the same buckets, no version) open
// with their manifests and references, and are version 1 from then on; a meta.db of a newer version is refused,
// named.
func TestMetaDBFromTheReleasedLayout(t *testing.T) {
	src := newMemTarget()
	desc := src.manifestDesc(modelManifest(t, src, sampleModel(t, 1)))
	root := t.TempDir()
	opts := Options{Root: root, VolatileOwnerPrefix: "csi-"}
	c, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"pin:p", "csi-v"} {
		if _, err := c.Acquire(o, desc.Digest, Selector{}); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	meta := filepath.Join(root, "meta.db")
	holds, _ := filepath.Glob(filepath.Join(root, "holds", "*.db"))
	if len(holds) != 1 {
		t.Fatalf("holds files %v", holds)
	}
	setVersion := func(file, v string) {
		db, err := bolt.Open(file, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.Update(func(tx *bolt.Tx) error {
			if v == "" {
				return tx.DeleteBucket([]byte("schema"))
			}
			return tx.Bucket([]byte("schema")).Put([]byte("version"), []byte(v))
		}); err != nil {
			t.Fatal(err)
		}
	}
	setVersion(meta, "") // the released layout
	setVersion(holds[0], "")

	c, err = Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := owners(t, c); !slices.Equal(got, []string{"csi-v", "pin:p"}) {
		t.Fatalf("references after the migration: %v", got)
	}
	if !c.Has(desc.Digest) {
		t.Fatal("the pulled manifest is gone after the migration")
	}
	for _, db := range []*bolt.DB{c.db, c.holds} {
		db.View(func(tx *bolt.Tx) error {
			if v, err := schema.Version(tx); v != 1 || err != nil {
				t.Errorf("%s at version %d (%v), want 1", db.Path(), v, err)
			}
			return nil
		})
	}
	c.Close()

	setVersion(meta, "2")
	_, err = Open(Options{Root: root})
	var ne *schema.NewerError
	if !errors.As(err, &ne) || ne.Path != meta || ne.Version != 2 || ne.Latest != 1 {
		t.Fatalf("a meta.db of a newer version: %v", err)
	}
}
