package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	digest "github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"

	"github.com/modelpack/modelpack/internal/diskio"
)

// The JSON documents of releases before state.db, each replaced atomically on every change. Open imports those it
// finds, each file's records in one transaction (the volumes into this boot's file, the rest into state.db, flushed),
// and removes the documents only after both committed. A crash in between leaves them, and the next Open imports the
// same records again over themselves: the import puts each record under its key, so nothing is duplicated.
const (
	legacyState   = "state.json"   // images, pulls, controller volumes; the volumes too, before volumes.json
	legacyVolumes = "volumes.json" // the published volumes
	legacyAccess  = "access.json"  // package access's records
	// legacyAccessVersion is the only version of access.json whose records are imported: those of version 1 were
	// granted on a manifest request alone, before blobs had to be served too, and grant nothing.
	legacyAccessVersion = 2
)

// volumesDoc is volumes.json.
type volumesDoc struct {
	Volumes map[string]Volume `json:"volumes"`
	// MigratedFrom is the sha256 of the state.json holding volumes that this document took them over from. Such a
	// state.json met again is that one, left by a driver killed between writing the two documents: this document
	// is newer. A state.json holding volumes with another digest was written since by a driver from before
	// volumes.json (a downgrade, then an upgrade): its volumes are the newer record.
	MigratedFrom string `json:"migratedFrom,omitempty"`
}

// accessDoc is access.json; each key's list stays as package access encoded it.
type accessDoc struct {
	Version int                        `json:"version"`
	Records map[string]json.RawMessage `json:"records"`
	Intents map[string]json.RawMessage `json:"intents,omitempty"`
}

// importLegacy imports the JSON documents in dir; lost lists those that did not parse (CorruptErrors: the state
// they held is lost; an unreadable access.json only costs each caller one check with the registry, and is not
// reported).
// afterCommit, if not nil (tests), runs once the import committed, before the documents are removed.
func (s *Store) importLegacy(dir string, afterCommit func()) (lost []error, err error) {
	var st State
	var found []string
	read := func(name string, v any) ([]byte, error) {
		p := filepath.Join(dir, name)
		raw, err := readDoc(p, v)
		if err == nil {
			found = append(found, p)
		}
		return raw, err
	}
	raw, err := read(legacyState, &st)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case errors.As(err, new(*CorruptError)):
		lost, st = append(lost, err), State{}
	case err != nil:
		return nil, err
	}
	legacy := len(st.Volumes) > 0
	var vols volumesDoc
	switch _, err := read(legacyVolumes, &vols); {
	case errors.Is(err, fs.ErrNotExist):
	case errors.As(err, new(*CorruptError)):
		lost, st.Volumes = append(lost, err), nil
	case err != nil:
		return nil, err
	case !legacy || vols.MigratedFrom == digest.FromBytes(raw).Encoded():
		// volumes.json is the record; a state.json still holding volumes is the one it took them over from.
		st.Volumes = vols.Volumes
	}
	var acc accessDoc
	if _, err := read(legacyAccess, &acc); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.As(err, new(*CorruptError)) {
		return nil, err
	}
	if acc.Version != legacyAccessVersion {
		acc.Records = nil
	}
	if len(found) == 0 {
		return lost, nil
	}
	if err := s.vols.Update(func(tx *bolt.Tx) error {
		return put(tx, map[string]map[string][]byte{string(bucketVolumes): encodeAll(st.Volumes)})
	}); err != nil {
		return nil, fmt.Errorf("import %s: %w", legacyVolumes, err)
	}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		return put(tx, map[string]map[string][]byte{
			string(bucketImages):            encodeAll(st.Images),
			string(bucketPulls):             encodeAll(st.Pulls),
			string(bucketControllerVolumes): encodeAll(st.ControllerVolumes),
			string(bucketAccessRecords):     encodeAll(acc.Records),
			string(bucketAccessIntents):     encodeAll(acc.Intents),
		})
	}); err != nil {
		return nil, fmt.Errorf("import %s and %s: %w", legacyState, legacyAccess, err)
	}
	if afterCommit != nil {
		afterCommit()
	}
	// Not flushed: a removal lost to a power loss imports the same records again.
	for _, p := range found {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	return lost, nil
}

func encodeAll[T any](m map[string]T) map[string][]byte {
	return changes(nil, m)
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
		return nil, setAside(path, jerr)
	}
	return b, nil
}
