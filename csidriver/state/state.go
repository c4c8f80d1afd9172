// Package state persists what the CSI driver has done on this node, so that a driver restarted after a crash or a
// SIGKILL still knows every target it published, every image a tag resolved to and every pull it had started.
//
// The whole state is one small JSON document replaced atomically (write to a temporary file, fsync, rename, fsync
// the directory): a reader after any crash sees either the state before an update or the state after it, never a
// torn mix. The node holds at most a few hundred volumes, so rewriting the document on each change costs far less
// than the mount it records.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

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

// State is everything persisted. Maps are keyed by target path, image key, pull key and volume name.
type State struct {
	Volumes           map[string]Volume           `json:"volumes"`
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
	path string
	mu   sync.Mutex
	st   *State
}

// Open loads the state at path, or starts empty if there is none. A document that does not parse (a disk error,
// an edit by hand) is moved aside to path+".corrupt" and the driver starts empty rather than refusing to run: the
// mounts themselves remain discoverable and unpublishing an unknown target still cleans it.
func Open(path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	s := &Store{path: path, st: &State{}}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if jerr := json.Unmarshal(b, s.st); jerr != nil {
			if err := os.Rename(path, path+".corrupt"); err != nil {
				return nil, fmt.Errorf("state %s is corrupt (%v) and cannot be moved aside: %w", path, jerr, err)
			}
			s.st = &State{}
			s.st.init()
			return s, &CorruptError{Path: path, Err: jerr}
		}
	}
	s.st.init()
	return s, nil
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

// Update applies fn to a copy of the state and persists the result durably; if fn or the write fails nothing
// changes.
func (s *Store) Update(fn func(*State) error) error { return s.update(fn, true) }

// UpdateNoSync is Update without waiting for the disk: the new state survives the process being killed (the
// rename is atomic and the kernel has the data) but maybe not a power loss, after which the old state is read.
func (s *Store) UpdateNoSync(fn func(*State) error) error { return s.update(fn, false) }

func (s *Store) update(fn func(*State) error, sync bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := s.st.clone()
	if err := fn(next); err != nil {
		return err
	}
	if err := s.write(next, sync); err != nil {
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
	if err := s.write(s.st, false); err != nil {
		return fmt.Errorf("state %s cannot be written: %w", s.path, err)
	}
	return nil
}

func (s *Store) write(st *State, sync bool) error {
	b, err := json.MarshalIndent(st, "", " ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(s.path)
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
	if err := os.Rename(tmp, s.path); err != nil {
		return err
	}
	committed = true
	if !sync {
		return nil
	}
	return diskio.SyncDir(dir)
}
