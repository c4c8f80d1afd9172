// Package state persists what the CSI driver has done on this node, so that a driver restarted after a crash or a
// SIGKILL still knows every target it published, every image a tag resolved to and every pull it had started, and
// keeps the access records of package access.
//
// The state is two bbolt files in the driver's state directory, each with a schema version (internal/schema), a
// bucket per kind of record and one transaction per change, so a crash leaves each record before or after an
// update, never torn:
//
//	state.db             images, pulls, controller volumes, access records and intents; every commit flushed to
//	                     disk, so it survives a power loss
//	volumes/<boot id>.db the published volumes, committed without a flush and trusted only in the boot that
//	                     wrote it (schema.OpenVolatile)
//
// The volumes are apart because a published volume is a bind mount, and no mount outlives the kernel: after a
// restart of the machine kubelet publishes again every volume of the pods that still exist (and the cache has
// dropped the holds those mounts took, which it keeps the same way). So a volume record only has to survive the
// driver being killed, which the kernel's page cache guarantees once the commit returned, and a publish does not
// wait for a flush that may queue behind gigabytes of pulled model. Commits without a flush cannot share a file
// with those that must survive a power loss (they may overwrite pages the last flushed commit points to).
//
// Releases before these files kept the state in JSON documents (state.json, volumes.json, access.json): Open
// imports those it finds and removes them once the import committed (legacy.go).
package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/diskio"
	"github.com/modelpack/modelpack/internal/schema"
)

// Phase is how far a publish got.
type Phase string

const (
	// PhaseMounting is recorded before the view is acquired and the target mounted, so a crash in between leaves
	// a record from which the driver can undo the half-done work.
	PhaseMounting Phase = "mounting"
	// PhasePublished means the target is mounted and handed to the container orchestrator.
	PhasePublished Phase = "published"
)

// Pod identifies the pod a volume was published for, when the orchestrator said (podInfoOnMount).
type Pod struct {
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	UID       string `json:"uid,omitempty"`
}

// Volume is one published target.
type Volume struct {
	VolumeID   string `json:"volumeId"`
	TargetPath string `json:"targetPath"`
	// Fingerprint identifies the publish arguments, to tell a retry from a conflicting request.
	Fingerprint string            `json:"fingerprint"`
	Attributes  map[string]string `json:"attributes"`
	Reference   string            `json:"reference"`
	Platform    string            `json:"platform,omitempty"`
	// Digest is what the reference resolved to; Manifest the platform's manifest within it (equal for a
	// single-platform artifact).
	Digest   string `json:"digest,omitempty"`
	Manifest string `json:"manifest,omitempty"`
	// Owner is the name the view is held under in the cache.
	Owner string `json:"owner"`
	// Source is the directory bind-mounted onto the target (the view, or a sub-directory of it).
	Source        string    `json:"source,omitempty"`
	SubPath       string    `json:"subPath,omitempty"`
	NoExec        bool      `json:"noexec,omitempty"`
	CreatedTarget bool      `json:"createdTarget"`
	Ephemeral     bool      `json:"ephemeral,omitempty"`
	Pod           Pod       `json:"pod,omitempty"`
	Phase         Phase     `json:"phase"`
	UpdatedAt     time.Time `json:"updatedAt"`
}

// Image records what a reference resolved to when it was last pulled, which is what `pullPolicy: Never` and
// `IfNotPresent` use without asking the registry.
type Image struct {
	Reference  string    `json:"reference"`
	Platform   string    `json:"platform,omitempty"`
	Digest     string    `json:"digest"`
	Manifest   string    `json:"manifest"`
	ResolvedAt time.Time `json:"resolvedAt"`
}

// Pull is a pull started and not yet finished, resumed after a restart.
type Pull struct {
	Reference string    `json:"reference"`
	Platform  string    `json:"platform,omitempty"`
	Digest    string    `json:"digest"`
	StartedAt time.Time `json:"startedAt"`
}

// ControllerVolume is a volume "created" by CreateVolume: only its parameters, no storage.
type ControllerVolume struct {
	ID            string            `json:"id"`
	Name          string            `json:"name"`
	Parameters    map[string]string `json:"parameters"`
	CapacityBytes int64             `json:"capacityBytes"`
}

// State is everything persisted but the access records. Maps are keyed by target path, image key, pull key and
// volume name.
type State struct {
	Volumes           map[string]Volume           `json:"volumes,omitempty"`
	Images            map[string]Image            `json:"images"`
	Pulls             map[string]Pull             `json:"pulls"`
	ControllerVolumes map[string]ControllerVolume `json:"controllerVolumes"`
}

func (s *State) init() {
	if s.Volumes == nil {
		s.Volumes = map[string]Volume{}
	}
	if s.Images == nil {
		s.Images = map[string]Image{}
	}
	if s.Pulls == nil {
		s.Pulls = map[string]Pull{}
	}
	if s.ControllerVolumes == nil {
		s.ControllerVolumes = map[string]ControllerVolume{}
	}
}

// clone copies through JSON: the state is small and a deep copy keeps callers from mutating the store's maps.
func (s *State) clone() *State {
	b, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("state: marshal: %v", err))
	}
	c := &State{}
	if err := json.Unmarshal(b, c); err != nil {
		panic(fmt.Sprintf("state: unmarshal: %v", err))
	}
	c.init()
	return c
}

const (
	stateFile  = "state.db"
	volumesDir = "volumes"
	// lockTimeout bounds the wait for another process holding the state (a second driver on the same node).
	lockTimeout = 10 * time.Second
)

// Buckets: each holds JSON records by the key of the map State keeps them in; the access buckets hold package
// access's lists of records by content key (host/repository@digest).
var (
	bucketImages            = []byte("images")
	bucketPulls             = []byte("pulls")
	bucketControllerVolumes = []byte("controllerVolumes")
	bucketAccessRecords     = []byte("accessRecords")
	bucketAccessIntents     = []byte("accessIntents")
	bucketVolumes           = []byte("volumes")
)

// The files' layout histories; a change of layout is a migration appended to one of them.
var (
	stateSchema = schema.Schema{Migrations: []schema.Migration{
		schema.CreateBuckets(bucketImages, bucketPulls, bucketControllerVolumes, bucketAccessRecords, bucketAccessIntents),
	}}
	volumesSchema = schema.Schema{Migrations: []schema.Migration{schema.CreateBuckets(bucketVolumes)}}
)

// Store is the persisted state, safe for concurrent use.
type Store struct {
	path string // state.db
	// db is state.db, vols this boot's volume records.
	db, vols *bolt.DB

	mu sync.Mutex
	st *State
	// enc is each record as committed, by bucket: an update writes only the records it changes.
	enc map[string]map[string][]byte
}

// Open opens the state in dir, creating it if there is none, and imports the JSON documents of earlier releases
// it finds there. A file that is not a bbolt database of ours (a disk error, an edit by hand, a link to a forged
// one elsewhere) is moved aside to its name+".corrupt", and a document that does not parse too; the driver then
// starts without it, told by a CorruptError beside the usable Store, rather than refusing to run: the mounts
// themselves remain discoverable and unpublishing an unknown target still cleans it. A file of a newer schema
// version is refused.
func Open(dir string) (*Store, error) {
	boot, err := cas.BootID()
	if err != nil {
		return nil, err
	}
	return openAt(dir, boot, nil)
}

// openAt is Open in the boot given; afterImport, if not nil (tests), runs between the import's commit and the
// removal of the documents imported.
func openAt(dir, boot string, afterImport func()) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	s := &Store{path: filepath.Join(dir, stateFile)}
	var corrupt []error
	db, err := openDurable(s.path)
	if c := (*CorruptError)(nil); errors.As(err, &c) {
		corrupt = append(corrupt, err)
	} else if err != nil {
		return nil, err
	}
	vols, dropped, err := schema.OpenVolatile(filepath.Join(dir, volumesDir), boot, volumesSchema, bolt.Options{Timeout: lockTimeout})
	if err != nil {
		db.Close()
		return nil, lockError(dir, err)
	}
	if dropped != nil {
		corrupt = append(corrupt, &CorruptError{Path: filepath.Join(dir, volumesDir, boot+".db"), Err: dropped, Dropped: true})
	}
	s.db, s.vols = db, vols
	lost, err := s.importLegacy(dir, afterImport)
	if err == nil {
		err = s.load()
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, errors.Join(append(corrupt, lost...)...)
}

// openDurable opens state.db, setting aside one that is not ours or not a database.
func openDurable(path string) (*bolt.DB, error) {
	var corrupt error
	if err := diskio.CheckPrivate(path); errors.Is(err, diskio.ErrNotOurs) {
		if corrupt = setAside(path, err); !errors.As(corrupt, new(*CorruptError)) {
			return nil, corrupt
		}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	opts := &bolt.Options{Timeout: lockTimeout, NoFreelistSync: true, FreelistType: bolt.FreelistMapType}
	db, err := schema.Open(path, stateSchema, opts)
	if errors.Is(err, bolt.ErrInvalid) || errors.Is(err, bolt.ErrChecksum) || errors.Is(err, bolt.ErrVersionMismatch) {
		if corrupt = setAside(path, err); !errors.As(corrupt, new(*CorruptError)) {
			return nil, corrupt
		}
		db, err = schema.Open(path, stateSchema, opts)
	}
	if err != nil {
		return nil, lockError(filepath.Dir(path), err)
	}
	return db, corrupt
}

func lockError(dir string, err error) error {
	if errors.Is(err, bolt.ErrTimeout) {
		return fmt.Errorf("state %s is held by another process (timed out after %s)", dir, lockTimeout)
	}
	return err
}

// setAside moves a file that cannot be believed to its name+".corrupt": a CorruptError, or the error of the move.
func setAside(path string, why error) error {
	if err := os.Rename(path, path+".corrupt"); err != nil {
		return fmt.Errorf("state %s is corrupt (%v) and cannot be moved aside: %w", path, why, err)
	}
	return &CorruptError{Path: path, Err: why}
}

// CorruptError reports state that was lost: a file or document moved aside, or (Dropped) deleted; the returned
// Store is usable.
type CorruptError struct {
	Path    string
	Err     error
	Dropped bool
}

func (e *CorruptError) Error() string {
	if e.Dropped {
		return fmt.Sprintf("state %s was unreadable and was dropped: %v", e.Path, e.Err)
	}
	return fmt.Sprintf("state %s was corrupt and was moved to %s.corrupt: %v", e.Path, e.Path, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// load reads every record into memory.
func (s *Store) load() error {
	s.st = &State{}
	s.st.init()
	s.enc = map[string]map[string][]byte{}
	read := func(db *bolt.DB, name []byte, into func(k string, v []byte) error) error {
		enc := map[string][]byte{}
		s.enc[string(name)] = enc
		return db.View(func(tx *bolt.Tx) error {
			return tx.Bucket(name).ForEach(func(k, v []byte) error {
				enc[string(k)] = bytes.Clone(v)
				if err := into(string(k), v); err != nil {
					return fmt.Errorf("%s: record %s/%q: %w", db.Path(), name, k, err)
				}
				return nil
			})
		})
	}
	return errors.Join(
		read(s.vols, bucketVolumes, decodeInto(s.st.Volumes)),
		read(s.db, bucketImages, decodeInto(s.st.Images)),
		read(s.db, bucketPulls, decodeInto(s.st.Pulls)),
		read(s.db, bucketControllerVolumes, decodeInto(s.st.ControllerVolumes)),
	)
}

func decodeInto[T any](m map[string]T) func(k string, v []byte) error {
	return func(k string, v []byte) error {
		var r T
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		m[k] = r
		return nil
	}
}

// changes lists the records of next that differ from those committed (enc), encoded; nil for one deleted.
func changes[T any](enc map[string][]byte, next map[string]T) map[string][]byte {
	out := map[string][]byte{}
	for k, v := range next {
		b, err := json.Marshal(v)
		if err != nil {
			panic(fmt.Sprintf("state: marshal: %v", err))
		}
		if old, ok := enc[k]; !ok || !bytes.Equal(old, b) {
			out[k] = b
		}
	}
	for k := range enc {
		if _, ok := next[k]; !ok {
			out[k] = nil
		}
	}
	return out
}

// commit writes, in one transaction of db, the changed records of each bucket (nil deletes).
func commit(db *bolt.DB, changed map[string]map[string][]byte) error {
	return db.Update(func(tx *bolt.Tx) error { return put(tx, changed) })
}

func put(tx *bolt.Tx, changed map[string]map[string][]byte) error {
	for name, recs := range changed {
		b := tx.Bucket([]byte(name))
		for k, v := range recs {
			var err error
			if v == nil {
				err = b.Delete([]byte(k))
			} else {
				err = b.Put([]byte(k), v)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// Path is state.db's location.
func (s *Store) Path() string { return s.path }

// Close closes the state's files; the Store is not to be used after.
func (s *Store) Close() error {
	var errs []error
	for _, db := range []*bolt.DB{s.vols, s.db} {
		if db != nil {
			errs = append(errs, db.Close())
		}
	}
	return errors.Join(errs...)
}

// Snapshot returns a copy of the current state.
func (s *Store) Snapshot() *State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.clone()
}

// Update applies fn to a copy of the state and commits the records it changed: volumes in this boot's file without
// a flush, the rest in state.db durably (see the package comment); if fn or a commit fails nothing changes.
func (s *Store) Update(fn func(*State) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := s.st.clone()
	if err := fn(next); err != nil {
		return err
	}
	vols := map[string]map[string][]byte{string(bucketVolumes): changes(s.enc[string(bucketVolumes)], next.Volumes)}
	durable := map[string]map[string][]byte{
		string(bucketImages):            changes(s.enc[string(bucketImages)], next.Images),
		string(bucketPulls):             changes(s.enc[string(bucketPulls)], next.Pulls),
		string(bucketControllerVolumes): changes(s.enc[string(bucketControllerVolumes)], next.ControllerVolumes),
	}
	volsChanged, durableChanged := someChange(vols), someChange(durable)
	if volsChanged {
		if err := commit(s.vols, vols); err != nil {
			return err
		}
	}
	if durableChanged {
		if err := commit(s.db, durable); err != nil {
			if volsChanged {
				// Best effort: the volumes as they were, so the files agree with the state kept in memory.
				commit(s.vols, s.undo(vols))
			}
			return err
		}
	}
	for _, changed := range []map[string]map[string][]byte{vols, durable} {
		for name, recs := range changed {
			for k, v := range recs {
				if v == nil {
					delete(s.enc[name], k)
				} else {
					s.enc[name][k] = v
				}
			}
		}
	}
	s.st = next
	return nil
}

func someChange(changed map[string]map[string][]byte) bool {
	for _, recs := range changed {
		if len(recs) > 0 {
			return true
		}
	}
	return false
}

// undo is the commit that restores the records changed as they were.
func (s *Store) undo(changed map[string]map[string][]byte) map[string]map[string][]byte {
	out := map[string]map[string][]byte{}
	for name, recs := range changed {
		out[name] = map[string][]byte{}
		for k := range recs {
			out[name][k] = s.enc[name][k]
		}
	}
	return out
}

// Writable reports why the state cannot be written, as every publish would find: a file made immutable, a file
// system gone read-only. It commits (without a flush) in the volume records' file, which a publish writes, and
// opens state.db for writing without writing to it (a commit there would cost a flush).
func (s *Store) Writable() error {
	err := schema.Probe(s.vols)
	if err == nil {
		var f *os.File
		if f, err = os.OpenFile(s.path, os.O_WRONLY, 0); err == nil {
			err = f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("state %s cannot be written: %w", filepath.Dir(s.path), err)
	}
	return nil
}

// Access returns the access records and intents, each key's list as package access encoded it.
func (s *Store) Access() (records, intents map[string][]byte, err error) {
	records, intents = map[string][]byte{}, map[string][]byte{}
	err = s.db.View(func(tx *bolt.Tx) error {
		for name, m := range map[string]map[string][]byte{string(bucketAccessRecords): records, string(bucketAccessIntents): intents} {
			if err := tx.Bucket([]byte(name)).ForEach(func(k, v []byte) error {
				m[string(k)] = bytes.Clone(v)
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	return records, intents, err
}

// SetAccess commits, in one transaction flushed to disk, the lists of access records and intents given by key
// (nil deletes a key's list).
func (s *Store) SetAccess(records, intents map[string][]byte) error {
	return commit(s.db, map[string]map[string][]byte{string(bucketAccessRecords): records, string(bucketAccessIntents): intents})
}
