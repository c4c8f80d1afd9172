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

// A meta.db as releases before schema versions wrote it (the same buckets, no version) opens with its manifests
// and references, and is version 1 from then on; a meta.db of a newer version is refused, named.
func TestMetaDBFromTheReleasedLayout(t *testing.T) {
	src := newMemTarget()
	desc := src.manifestDesc(modelManifest(t, src, sampleModel(t, 1)))
	root := t.TempDir()
	c, err := Open(Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire("pin:p", desc.Digest, Selector{}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	meta := filepath.Join(root, "meta.db")
	setVersion := func(v string) {
		db, err := bolt.Open(meta, 0o600, nil)
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
	setVersion("") // the released layout

	c, err = Open(Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if got := owners(t, c); !slices.Equal(got, []string{"pin:p"}) {
		t.Fatalf("references after the migration: %v", got)
	}
	if !c.Has(desc.Digest) {
		t.Fatal("the pulled manifest is gone after the migration")
	}
	c.db.View(func(tx *bolt.Tx) error {
		if v, err := schema.Version(tx); v != 1 || err != nil {
			t.Errorf("meta.db at version %d (%v), want 1", v, err)
		}
		return nil
	})
	c.Close()

	setVersion("2")
	_, err = Open(Options{Root: root})
	var ne *schema.NewerError
	if !errors.As(err, &ne) || ne.Path != meta || ne.Version != 2 || ne.Latest != 1 {
		t.Fatalf("a meta.db of a newer version: %v", err)
	}
}
