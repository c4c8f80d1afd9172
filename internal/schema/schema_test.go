package schema

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func versionOf(t *testing.T, db *bolt.DB) int {
	t.Helper()
	var v int
	if err := db.View(func(tx *bolt.Tx) (err error) { v, err = Version(tx); return err }); err != nil {
		t.Fatal(err)
	}
	return v
}

// A file without a version (written before it had one) runs every migration, in order, once; a file at the
// latest version runs none and is not written to.
func TestMigrationsRunInOrderOnce(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f.db")
	// The released layout: a bucket with a record, no version.
	db, err := bolt.Open(p, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("a"))
		if err != nil {
			return err
		}
		return b.Put([]byte("k"), []byte("v"))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	var ran []string
	s := Schema{Migrations: []Migration{
		func(tx *bolt.Tx) error { ran = append(ran, "1"); return CreateBuckets([]byte("a"))(tx) },
		func(tx *bolt.Tx) error { ran = append(ran, "2"); return CreateBuckets([]byte("b"))(tx) },
	}}
	db, err = Open(p, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(ran, ",") != "1,2" || versionOf(t, db) != 2 {
		t.Fatalf("ran %v, version %d", ran, versionOf(t, db))
	}
	db.View(func(tx *bolt.Tx) error {
		if string(tx.Bucket([]byte("a")).Get([]byte("k"))) != "v" || tx.Bucket([]byte("b")) == nil {
			t.Error("the released records or the new bucket are missing")
		}
		return nil
	})
	txid := func(db *bolt.DB) (id int) {
		db.View(func(tx *bolt.Tx) error { id = tx.ID(); return nil })
		return id
	}
	migrated := txid(db)
	db.Close()

	ran = nil
	db, err = Open(p, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if len(ran) != 0 {
		t.Fatalf("migrations ran again: %v", ran)
	}
	if id := txid(db); id != migrated {
		t.Fatalf("the file was written at an open without migration: transaction %d, was %d", id, migrated)
	}
}

// A failed migration leaves the file as it was: no version change, no partial change.
func TestFailedMigrationChangesNothing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f.db")
	db, err := Open(p, Schema{Migrations: []Migration{CreateBuckets([]byte("a"))}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	boom := errors.New("boom")
	_, err = Open(p, Schema{Migrations: []Migration{
		CreateBuckets([]byte("a")),
		func(tx *bolt.Tx) error {
			if _, err := tx.CreateBucket([]byte("half")); err != nil {
				return err
			}
			return boom
		},
	}}, nil)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "version 1 to 2") {
		t.Fatalf("got %v", err)
	}
	db, err = bolt.Open(p, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if v := versionOf(t, db); v != 1 {
		t.Fatalf("version %d after a failed migration", v)
	}
	db.View(func(tx *bolt.Tx) error {
		if tx.Bucket([]byte("half")) != nil {
			t.Error("a failed migration's change was committed")
		}
		return nil
	})
}

// A file of a newer version is refused, named, with its version and the latest this binary knows, and left as
// it was.
func TestNewerFileIsRefused(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f.db")
	three := Schema{Migrations: []Migration{CreateBuckets(), CreateBuckets(), CreateBuckets()}}
	db, err := Open(p, three, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	before, _ := os.ReadFile(p)
	_, err = Open(p, Schema{Migrations: three.Migrations[:1]}, nil)
	var ne *NewerError
	if !errors.As(err, &ne) || ne.Path != p || ne.Version != 3 || ne.Latest != 1 {
		t.Fatalf("got %v", err)
	}
	for _, want := range []string{p, "schema version 3", "up to 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if after, _ := os.ReadFile(p); string(after) != string(before) {
		t.Error("a refused file was written to")
	}
}
