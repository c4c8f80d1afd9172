package schema

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/modelpack/modelpack/internal/diskio"
)

// OpenVolatile opens dir/<boot>.db: a file committed without a flush to disk (NoSync), for records that stand for
// what no restart of the machine outlives (bind mounts, and the holds they take). A commit there survives the
// process being killed (the kernel has its pages) and waits for no fdatasync, which on a busy disk queues behind
// everything written recently. Such a file is trusted only within the boot that wrote it: after a power loss its
// pages may be torn, so whatever else dir holds (the files of other boots) is deleted unread. A file of this boot
// that cannot be opened, or that others may write, is deleted and started afresh; dropped then says why, for the
// caller to tell. A file of a newer schema version is refused, as by Open.
//
// Never mix such commits into a file that must survive a power loss: a commit without a flush may overwrite pages
// the last flushed commit still points to.
func OpenVolatile(dir, boot string, s Schema, opts bolt.Options) (db *bolt.DB, dropped, err error) {
	if boot == "" || strings.ContainsAny(boot, `/\.`) {
		return nil, nil, fmt.Errorf("boot id %q cannot name a file", boot)
	}
	if fi, err := os.Lstat(dir); err == nil && !fi.IsDir() {
		if err := os.Remove(dir); err != nil {
			return nil, nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	name := boot + ".db"
	for _, e := range entries {
		if e.Name() != name || !e.Type().IsRegular() {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return nil, nil, err
			}
		}
	}
	opts.NoSync, opts.NoGrowSync = true, true
	path := filepath.Join(dir, name)
	// Nor is a file others may write (or of another owner) believed.
	if err := diskio.CheckPrivate(path); errors.Is(err, diskio.ErrNotOurs) {
		dropped = err
		if err := os.Remove(path); err != nil {
			return nil, nil, err
		}
	}
	db, err = Open(path, s, &opts)
	var newer *NewerError
	if err != nil && !errors.Is(err, bolt.ErrTimeout) && !errors.As(err, &newer) {
		dropped = err
		if err := os.Remove(path); err != nil {
			return nil, nil, err
		}
		db, err = Open(path, s, &opts)
	}
	return db, dropped, err
}
