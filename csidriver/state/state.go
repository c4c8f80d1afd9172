// Package state persists what the CSI driver has done on this node, so that a driver restarted after a crash or a
// SIGKILL still knows every target it published, every image a tag resolved to and every pull it had started.
//
// The state is two small JSON documents, each replaced atomically (write to a temporary file, rename): a reader
// after a crash sees either a document before an update or after it, never a torn mix. state.json (images, pulls,
// controller volumes) is also flushed to disk (fsync of the file and of the directory), so it survives a power
// loss. volumes.json (the published volumes) never is: a published volume is a bind mount, and no mount outlives
// the kernel; after a restart of the machine kubelet publishes again every volume of the pods that still exist. So
// a volume record only has to survive the driver being killed, which the kernel's page cache guarantees once the
// rename returned, and a publish does not wait for a flush that may queue behind gigabytes of pulled model. The
// node holds at most a few hundred volumes, so rewriting a document on each change costs far less than the mount
// it records.
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

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/internal/diskio"
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

// State is everything persisted. Maps are keyed by target path, image key, pull key and volume name. Volumes are
// kept in volumes.json; state.json held them too before that existed, and such a state.json is still read.
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

// Store is the persisted state, safe for concurrent use.
type Store struct {
	path, volPath string
	mu            sync.Mutex
	st            *State
	// durable and volumes are the documents as last written (or read): an update rewrites only those it changes.
	// nil forces a write (a state.json from before volumes.json, whose volumes move out at the next update).
	durable, volumes []byte
	// migratedFrom is the sha256 of the state.json whose volumes volumes.json took over (volumesDoc).
	migratedFrom string
}

// volumesDoc is volumes.json.
type volumesDoc struct {
	Volumes map[string]Volume `json:"volumes"`
	// MigratedFrom is the sha256 of the state.json holding volumes that this document took them over from. Such a
	// state.json met again is that one, left by a driver killed between writing the two documents: this document
	// is newer. A state.json holding volumes with another digest was written since by a driver from before
	// volumes.json (a downgrade, then an upgrade): its volumes are the newer record.
	MigratedFrom string `json:"migratedFrom,omitempty"`
}

// Open loads the state at path (and the volume records beside it, in volumes.json), or starts empty if there is
// none. A document that does not parse (a disk error, an edit by hand) is moved aside to its name+".corrupt" and
// the driver starts without it rather than refusing to run: the mounts themselves remain discoverable and
// unpublishing an unknown target still cleans it.
func Open(path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	s := &Store{path: path, volPath: filepath.Join(filepath.Dir(path), "volumes.json"), st: &State{}}
	var corrupt []error
	raw, err := readDoc(path, s.st)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case errors.As(err, new(*CorruptError)):
		corrupt = append(corrupt, err)
		s.st = &State{}
	case err != nil:
		return nil, err
	}
	legacy := len(s.st.Volumes) > 0
	legacySum := ""
	if legacy {
		legacySum = digest.FromBytes(raw).Encoded()
	}
	var vols volumesDoc
	switch _, err := readDoc(s.volPath, &vols); {
	case errors.Is(err, fs.ErrNotExist):
	case errors.As(err, new(*CorruptError)):
		corrupt = append(corrupt, err)
		s.st.Volumes = nil
	case err != nil:
		return nil, err
	case !legacy || vols.MigratedFrom == legacySum:
		// volumes.json is the record; a state.json still holding volumes is the one it took them over from.
		s.st.Volumes, legacy, s.migratedFrom = vols.Volumes, false, vols.MigratedFrom
	}
	s.st.init()
	if legacy {
		s.migratedFrom = legacySum
	} else {
		s.durable, s.volumes = s.docs(s.st)
	}
	return s, errors.Join(corrupt...)
}

// readDoc decodes the document at path into v and returns its bytes; one that does not parse, or that is not a
// regular file the driver wrote, is moved aside (a CorruptError).
func readDoc(path string, v any) ([]byte, error) {
	// Not following links, and only a regular file of the driver's user nobody else may write: a link to a
	// forged state elsewhere is set aside like a corrupt one, not believed.
	b, jerr := diskio.ReadPrivate(path)
	if jerr != nil && !errors.Is(jerr, diskio.ErrNotOurs) {
		return nil, jerr
	}
	if jerr == nil {
		jerr = json.Unmarshal(b, v)
	}
	if jerr != nil {
		if err := os.Rename(path, path+".corrupt"); err != nil {
			return nil, fmt.Errorf("state %s is corrupt (%v) and cannot be moved aside: %w", path, jerr, err)
		}
		return nil, &CorruptError{Path: path, Err: jerr}
	}
	return b, nil
}

// CorruptError reports a state document that was moved aside; the returned Store is usable.
type CorruptError struct {
	Path string
	Err  error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("state %s was corrupt and was moved to %s.corrupt: %v", e.Path, e.Path, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// Path is the state document's location.
func (s *Store) Path() string { return s.path }

// Snapshot returns a copy of the current state.
func (s *Store) Snapshot() *State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.clone()
}

// Update applies fn to a copy of the state and persists the documents it changed: state.json durably,
// volumes.json without a flush (see the package comment); if fn or a write fails nothing changes.
func (s *Store) Update(fn func(*State) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := s.st.clone()
	if err := fn(next); err != nil {
		return err
	}
	durable, volumes := s.docs(next)
	if bytes.Equal(volumes, s.volumes) {
		volumes = nil
	}
	if bytes.Equal(durable, s.durable) {
		durable = nil
	}
	if err := s.write(durable, volumes, true); err != nil {
		return err
	}
	s.st = next
	return nil
}

// Writable rewrites the current state (without a flush: the bytes are those on disk already) and reports why it
// cannot, as every publish would find: a state file made immutable, a file system gone read-only, a full disk.
func (s *Store) Writable() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	durable, volumes := s.docs(s.st)
	if err := s.write(durable, volumes, false); err != nil {
		return fmt.Errorf("state %s cannot be written: %w", s.path, err)
	}
	return nil
}

// docs renders st as state.json and volumes.json.
func (s *Store) docs(st *State) (durable, volumes []byte) {
	rest := *st
	rest.Volumes = nil
	durable, err := json.MarshalIndent(rest, "", " ")
	if err == nil {
		volumes, err = json.MarshalIndent(volumesDoc{Volumes: st.Volumes, MigratedFrom: s.migratedFrom}, "", " ")
	}
	if err != nil {
		panic(fmt.Sprintf("state: marshal: %v", err))
	}
	return durable, volumes
}

// write replaces the documents given (nil: unchanged). volumes.json goes first: while a state.json from before it
// still holds volumes, volumes.json must exist before that state.json is replaced by one without them.
func (s *Store) write(durable, volumes []byte, sync bool) error {
	if volumes != nil {
		if err := replace(s.volPath, volumes, false); err != nil {
			return err
		}
		s.volumes = volumes
	}
	if durable != nil {
		if err := replace(s.path, durable, sync); err != nil {
			return err
		}
		s.durable = durable
	}
	return nil
}

// replace writes b to path atomically, and with sync durably.
func replace(path string, b []byte, sync bool) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".state-*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	committed := false
	defer func() {
		if !committed {
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if sync {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	committed = true
	if !sync {
		return nil
	}
	return diskio.SyncDir(dir)
}
