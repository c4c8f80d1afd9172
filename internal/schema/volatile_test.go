package schema

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

var volatileSchema = Schema{Migrations: []Migration{CreateBuckets([]byte("b"))}}

func put(t *testing.T, db *bolt.DB) {
	t.Helper()
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("b")).Put([]byte("k"), []byte("v")) }); err != nil {
		t.Fatal(err)
	}
}

func has(db *bolt.DB) (ok bool) {
	db.View(func(tx *bolt.Tx) error { ok = tx.Bucket([]byte("b")).Get([]byte("k")) != nil; return nil })
	return ok
}

// A volatile file is kept within its boot and deleted unread in the next; one that cannot be opened, or that others
// may write, is dropped and said so; one of a newer version is refused and kept.
func TestVolatileFileLastsItsBoot(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "v")
	open := func(boot string) (*bolt.DB, error) {
		t.Helper()
		db, dropped, err := OpenVolatile(dir, boot, volatileSchema, bolt.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return db, dropped
	}
	db, dropped := open("b1")
	if dropped != nil || !db.NoSync {
		t.Fatalf("dropped %v, NoSync %v", dropped, db.NoSync)
	}
	put(t, db)
	db.Close()
	os.WriteFile(filepath.Join(dir, "stray"), nil, 0o600)
	if db, _ = open("b1"); !has(db) {
		t.Fatal("the record is gone within its boot")
	}
	db.Close()
	if db, _ = open("b2"); has(db) {
		t.Fatal("a record of another boot was read")
	}
	db.Close()
	if entries, _ := os.ReadDir(dir); len(entries) != 1 || entries[0].Name() != "b2.db" {
		t.Fatalf("left in the directory: %v", entries)
	}

	p := filepath.Join(dir, "b2.db")
	for name, plant := range map[string]func(){
		"garbage":  func() { os.WriteFile(p, []byte("not bbolt"), 0o600) },
		"writable": func() { os.Chmod(p, 0o666) },
	} {
		plant()
		db, dropped = open("b2")
		if dropped == nil || has(db) {
			t.Errorf("%s: dropped %v, record kept %v", name, dropped, has(db))
		}
		put(t, db)
		db.Close()
	}

	db, _ = open("b2")
	db.Update(func(tx *bolt.Tx) error { return setVersion(tx, 5) })
	db.Close()
	_, _, err := OpenVolatile(dir, "b2", volatileSchema, bolt.Options{})
	var ne *NewerError
	if !errors.As(err, &ne) || ne.Path != p {
		t.Fatalf("a volatile file of a newer version: %v", err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the refused file was removed: %v", err)
	}
}
