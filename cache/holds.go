package cache

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"

	"github.com/modelpack/modelpack/cas"
)

// The references of volatile owners (Options.VolatileOwnerPrefix: the CSI driver's volumes) stand for bind mounts,
// and no mount outlives the kernel: after a restart of the machine kubelet publishes, and so acquires, again every
// volume of the pods that still exist. They are kept apart from meta.db, in holds/<boot id>.db, a bbolt file
// committed without a flush to disk (NoSync). A commit there survives the process being killed (the kernel has its
// pages) and waits for no fdatasync, which on a busy disk queues behind everything written recently (a 2 GiB pull
// being flushed). Such a file is trusted only within the boot that wrote it: after a power loss its pages may be
// torn, so at Open a file of another boot is deleted without being read, and its holds go with the mounts they
// stood for. A volatile Acquire records the manifest's last use there too (in meta.db it would be a durable
// commit); readers take the later of the two, and GC copies it into meta.db in its own transaction.

// bucketHoldUse is in the holds file only.
var bucketHoldUse = []byte("lastUsed") // manifest digest -> time of its last Acquire by a volatile owner

// openHolds opens this boot's holds file, deleting those of other boots, and one of this boot that cannot be
// opened (its holds are lost as after a restart: kubelet's next publish of each volume takes its hold again).
func openHolds(root string, opts Options) (*bolt.DB, error) {
	boot, err := cas.BootID()
	if err != nil {
		return nil, err
	}
	if boot == "" || strings.ContainsAny(boot, `/\.`) {
		return nil, fmt.Errorf("boot id %q cannot name a file", boot)
	}
	dir := filepath.Join(root, "holds")
	// Whatever else is found there (a directory, a link, a file of another boot) holds nothing of this boot.
	if fi, err := os.Lstat(dir); err == nil && !fi.IsDir() {
		if err := os.Remove(dir); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	name := boot + ".db"
	for _, e := range entries {
		if e.Name() != name || !e.Type().IsRegular() {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return nil, err
			}
		}
	}
	path := filepath.Join(dir, name)
	db, err := openHoldsFile(path, opts)
	if err != nil && !errors.Is(err, bolt.ErrTimeout) {
		opts.Logger.Warn("the volatile holds of this boot are unreadable and are dropped", "path", path, "error", err.Error())
		if err := os.Remove(path); err != nil {
			return nil, err
		}
		db, err = openHoldsFile(path, opts)
	}
	return db, err
}

func openHoldsFile(path string, opts Options) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.LockTimeout, NoSync: true, NoGrowSync: true,
		NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return nil, err
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketRefs, bucketHoldUse} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// volatile reports whether owner's reference lives in the holds file.
func (c *Cache) volatile(owner string) bool {
	p := c.opts.VolatileOwnerPrefix
	return p != "" && strings.HasPrefix(owner, p)
}

// refsDB is the database holding owner's reference.
func (c *Cache) refsDB(owner string) *bolt.DB {
	if c.volatile(owner) {
		return c.holds
	}
	return c.db
}

// allHolds reads every reference, meta.db's (tx) and the holds file's, and the last uses the holds file records.
func (c *Cache) allHolds(tx *bolt.Tx) (map[string]refRecord, map[digest.Digest]time.Time, error) {
	refs, err := allRefs(tx)
	if err != nil {
		return nil, nil, err
	}
	used := map[digest.Digest]time.Time{}
	err = c.holds.View(func(htx *bolt.Tx) error {
		vrefs, err := allRefs(htx)
		for owner, r := range vrefs {
			refs[owner] = r
		}
		if err != nil {
			return err
		}
		return htx.Bucket(bucketHoldUse).ForEach(func(k, v []byte) error {
			var t time.Time
			if err := t.UnmarshalJSON(v); err != nil {
				return err
			}
			used[digest.Digest(k)] = t
			return nil
		})
	})
	return refs, used, err
}

// moveVolatileRefs moves into the holds file the references of volatile owners that meta.db holds (recorded before
// the holds file existed). It runs at Open, within meta.db's transaction tx; killed between the two commits, an
// owner is in both with one record, and the next Open moves it again.
func (c *Cache) moveVolatileRefs(tx *bolt.Tx) error {
	p := []byte(c.opts.VolatileOwnerPrefix)
	if len(p) == 0 {
		return nil
	}
	moved := map[string][]byte{}
	refs := tx.Bucket(bucketRefs)
	cur := refs.Cursor()
	for k, v := cur.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = cur.Next() {
		moved[string(k)] = append([]byte(nil), v...)
	}
	if len(moved) == 0 {
		return nil
	}
	if err := c.holds.Update(func(htx *bolt.Tx) error {
		for owner, v := range moved {
			if err := htx.Bucket(bucketRefs).Put([]byte(owner), v); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for owner := range moved {
		if err := refs.Delete([]byte(owner)); err != nil {
			return err
		}
	}
	return nil
}
