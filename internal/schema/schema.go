// Package schema opens the node's bbolt files with a version of their layout and the forward migrations that
// bring a file of an earlier release to it.
//
// A file records its version in the bucket "schema" (key "version", in decimal). A file without it is version 0:
// a new file, or one written before it had a version (whose migration to version 1 must then accept both). Open
// runs the missing migrations in order in one transaction with the new version, so a crash leaves the file at
// its old version or at the new one, never between; it refuses a file of a version this binary does not know
// (a newer release wrote it) without writing to it.
package schema

import (
	"fmt"
	"strconv"

	bolt "go.etcd.io/bbolt"
)

// Migration changes the layout of version n-1 into version n, within the opening transaction.
type Migration func(tx *bolt.Tx) error

// Schema is the history of a file's layout: version n is what Migrations[n-1] leaves. Released versions are never
// edited: a change of layout is a new migration at the end.
type Schema struct {
	Migrations []Migration
}

// Latest is the version this binary writes.
func (s Schema) Latest() int { return len(s.Migrations) }

var (
	bucketSchema = []byte("schema")
	keyVersion   = []byte("version")
)

// NewerError refuses a file whose version is newer than this binary knows.
type NewerError struct {
	Path            string
	Version, Latest int
}

func (e *NewerError) Error() string {
	return fmt.Sprintf("%s has schema version %d, and this binary knows versions up to %d: a newer modelpack wrote it "+
		"(run that release, or move the file aside to start without it)", e.Path, e.Version, e.Latest)
}

// Open opens the bbolt file at path (mode 0600) and brings it to s's latest version. Errors of bbolt itself (its
// lock timed out, the file is no bbolt database) come back unwrapped, for errors.Is.
func Open(path string, s Schema, opts *bolt.Options) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, opts)
	if err != nil {
		return nil, err
	}
	if err := migrate(db, s); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

func migrate(db *bolt.DB, s Schema) error {
	var v int
	if err := db.View(func(tx *bolt.Tx) error {
		var err error
		v, err = Version(tx)
		return err
	}); err != nil {
		return fmt.Errorf("%s: %w", db.Path(), err)
	}
	if v > s.Latest() {
		return &NewerError{Path: db.Path(), Version: v, Latest: s.Latest()}
	}
	if v == s.Latest() {
		return nil // a file at its version is not written to at open
	}
	return db.Update(func(tx *bolt.Tx) error {
		for n := v + 1; n <= s.Latest(); n++ {
			if err := s.Migrations[n-1](tx); err != nil {
				return fmt.Errorf("%s: migrate from schema version %d to %d: %w", db.Path(), n-1, n, err)
			}
		}
		return setVersion(tx, s.Latest())
	})
}

// Version is the file's schema version as of tx.
func Version(tx *bolt.Tx) (int, error) {
	b := tx.Bucket(bucketSchema)
	if b == nil {
		return 0, nil
	}
	raw := b.Get(keyVersion)
	if raw == nil {
		return 0, nil
	}
	v, err := strconv.Atoi(string(raw))
	if err != nil || v < 0 {
		return 0, fmt.Errorf("schema version %q unreadable", raw)
	}
	return v, nil
}

func setVersion(tx *bolt.Tx, v int) error {
	b, err := tx.CreateBucketIfNotExists(bucketSchema)
	if err != nil {
		return err
	}
	return b.Put(keyVersion, []byte(strconv.Itoa(v)))
}

// CreateBuckets is a migration creating the buckets named (those already there are kept, with their records).
func CreateBuckets(names ...[]byte) Migration {
	return func(tx *bolt.Tx) error {
		for _, n := range names {
			if _, err := tx.CreateBucketIfNotExists(n); err != nil {
				return fmt.Errorf("bucket %s: %w", n, err)
			}
		}
		return nil
	}
}

// Probe commits a rewrite of db's version, to learn whether db can be written (a file made immutable, a file
// system gone read-only) as the next change would be.
func Probe(db *bolt.DB) error {
	return db.Update(func(tx *bolt.Tx) error {
		v, err := Version(tx)
		if err != nil {
			return err
		}
		return setVersion(tx, v)
	})
}
