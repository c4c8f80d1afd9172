package cache

import (
	"bytes"
	"path/filepath"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"

	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/schema"
)

// The references of volatile owners (Options.VolatileOwnerPrefix: the CSI driver's volumes) stand for bind mounts,
// and no mount outlives the kernel: after a restart of the machine kubelet publishes, and so acquires, again every
// volume of the pods that still exist. They are kept apart from meta.db, in holds/<boot id>.db, a bbolt file
// committed without a flush to disk (NoSync; schema.OpenVolatile). A commit there survives the process being killed (the kernel has its
// pages) and waits for no fdatasync, which on a busy disk queues behind everything written recently (a 2 GiB pull
// being flushed). Such a file is trusted only within the boot that wrote it: after a power loss its pages may be
// torn, so at Open a file of another boot is deleted without being read, and its holds go with the mounts they
// stood for. A volatile Acquire records the manifest's last use there too (in meta.db it would be a durable
// commit); readers take the later of the two, and GC copies it into meta.db in its own transaction. They cannot be
// buckets of meta.db: a commit without a flush there may overwrite pages its last flushed commit points to (a power
// loss would then tear the durable metadata), and a flushed one would make every warm publish wait for the disk.

// bucketHoldUse is in the holds file only.
var bucketHoldUse = []byte("lastUsed") // manifest digest -> time of its last Acquire by a volatile owner

// holdsSchema is the holds file's layout history (version 1: the buckets as releases before versioning wrote them).
var holdsSchema = schema.Schema{Migrations: []schema.Migration{schema.CreateBuckets(bucketRefs, bucketHoldUse)}}

// openHolds opens this boot's holds file, deleting those of other boots, and one of this boot that cannot be
// opened (its holds are lost as after a restart: kubelet's next publish of each volume takes its hold again).
func openHolds(root string, opts Options) (*bolt.DB, error) {
	boot, err := cas.BootID()
	if err != nil {
		return nil, err
	}
	db, dropped, err := schema.OpenVolatile(filepath.Join(root, "holds"), boot, holdsSchema,
		bolt.Options{Timeout: opts.LockTimeout, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if dropped != nil {
		opts.Logger.Warn("the volatile holds of this boot are unreadable and are dropped", "error", dropped.Error())
	}
	return db, err
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
