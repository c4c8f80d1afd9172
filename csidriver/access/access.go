// Package access decides which callers may read content the node cache already holds: kubelet's "ensure secret
// pulled images" (KEP-2535) for models. The cache is shared by every pod on the node, so a digest on disk proves
// nothing about who may read it; what does is a record that the registry served that digest, under that
// registry host and repository, to that credential.
//
// A Store keeps those records, persisted next to the driver's state and crash-safe (an intent before a pull,
// the record after it), with credentials reduced to a keyed hash. A Policy applies kubelet's
// imagePullCredentialsVerificationPolicy to them.
package access

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/internal/diskio"
)

// Kind is whose credential a registry request presented.
type Kind string

const (
	// Anonymous: no credential; a success means the content is public.
	Anonymous Kind = "anonymous"
	// Node: the node's own credentials (its docker config), which a pod without a pull secret presents only under
	// NeverVerify; the Policy treats what they read as it treats prepulled content.
	Node Kind = "node"
	// Secret: a volume's pull secret (nodePublishSecretRef), known by a keyed hash of the credential.
	Secret Kind = "secret"
	// Prepull: a prepull (with the node's credentials, for no pod in particular): kubelet's "preloaded" images,
	// exempt or not from verification by the Policy.
	Prepull Kind = "prepull"
)

// Identity is a caller as the records know it.
type Identity struct {
	Kind Kind `json:"kind"`
	// Hash is the keyed hash of the credential presented to the registry host (Secret only).
	Hash string `json:"hash,omitempty"`
	// Namespace is the pod's namespace, when kubelet said (podInfoOnMount): who the record was made for. CSI
	// hands a driver a Secret's data, not its name or uid.
	Namespace string `json:"namespace,omitempty"`
}

// String names the identity in an error message without revealing anything of the credential.
func (i Identity) String() string {
	switch i.Kind {
	case Secret:
		s := "the volume's pull secret (credential " + shortHash(i.Hash) + ")"
		if i.Namespace != "" {
			s = "the pull secret of a volume in namespace " + i.Namespace + " (credential " + shortHash(i.Hash) + ")"
		}
		return s
	case Node:
		return "no pull secret for this registry (the node's credentials, if it has any)"
	case Anonymous:
		return "no credentials (no pull secret for this registry; a pod presents the node's only under " + string(NeverVerify) + ")"
	case Prepull:
		return "a prepull"
	}
	return string(i.Kind)
}

func shortHash(h string) string { return h[:min(len(h), 12)] }

// same reports whether two identities present the same credential (the namespace is bookkeeping).
func (i Identity) same(o Identity) bool { return i.Kind == o.Kind && i.Hash == o.Hash }

// Key is content as a registry serves it: a host, a repository in it and a digest. The same digest under another
// repository or host is another key: that registry must say it serves it before the node shares its copy.
type Key struct {
	Host       string
	Repository string
	Digest     digest.Digest
}

// Name is host/repository, what allowlist patterns match.
func (k Key) Name() string { return k.Host + "/" + k.Repository }

func (k Key) String() string { return k.Name() + "@" + k.Digest.String() }

// Via says how a record was earned.
type Via string

const (
	ViaPull    Via = "pull"    // the registry served the content to the credential
	ViaCheck   Via = "check"   // the registry answered a manifest request for it (the content was on the node)
	ViaPrepull Via = "prepull" // a prepull pulled it
)

// Record is one credential the registry served a key to.
type Record struct {
	Identity
	Via Via       `json:"via"`
	At  time.Time `json:"at"`
}

// maxRecordsPerKey bounds the records of one key (credentials rotate, tenants come and go); the oldest go first,
// which costs their owner one manifest request at its next publish.
const maxRecordsPerKey = 64

// fileVersion is the records' format; records of another version grant nothing.
const fileVersion = 2

// file is the persisted document.
type file struct {
	Version int                 `json:"version"`
	Records map[string][]Record `json:"records"`
	// Intents are pulls started for a credential and not yet recorded: after a crash they grant nothing.
	Intents map[string][]Record `json:"intents,omitempty"`
}

// Store is the records of one node, in memory for O(1) lookups and in a JSON document written atomically (a
// temporary file, fsync, rename, fsync of the directory) on every change; changes happen only when the
// registry was asked, so their cost hides behind that request.
type Store struct {
	path    string
	hmacKey []byte

	mu      sync.RWMutex
	records map[Key][]Record
	intents map[Key][]Record
}

const (
	recordsFile = "access.json"
	// keyFile holds the node's secret key for credential hashes, apart from the records: the records alone
	// allow no offline guessing of a credential.
	keyFile = "access.key"
)

// Open loads the records in dir, creating the key on first use. Intents left by a crash are dropped: the pull
// they announced recorded nothing, so its caller checks with the registry at its next publish. A records file
// that does not parse is set aside (every caller re-checks once), as a lost state would be.
func Open(dir string) (*Store, []Key, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	key, err := loadKey(filepath.Join(dir, keyFile))
	if err != nil {
		return nil, nil, err
	}
	s := &Store{path: filepath.Join(dir, recordsFile), hmacKey: key, records: map[Key][]Record{}, intents: map[Key][]Record{}}
	// Not following links, and only a regular file of the driver's user nobody else may write: forged records
	// (a link to a file elsewhere) are set aside as corrupt ones are, not believed.
	b, err := diskio.ReadPrivate(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil, nil
	}
	if err != nil && !errors.Is(err, diskio.ErrNotOurs) {
		return nil, nil, err
	}
	var f file
	if err == nil {
		err = json.Unmarshal(b, &f)
	}
	if err != nil {
		if rerr := os.Rename(s.path, s.path+".corrupt"); rerr != nil {
			return nil, nil, fmt.Errorf("access records %s are corrupt (%v) and cannot be moved aside: %w", s.path, err, rerr)
		}
		return s, nil, nil
	}
	if f.Version != fileVersion {
		// Records of version 1 were granted on a manifest request alone, before blobs had to be served too:
		// none is kept, so each caller is checked once more.
		f.Records = nil
	}
	for k, recs := range f.Records {
		key, err := parseKey(k)
		if err != nil {
			continue
		}
		s.records[key] = recs
	}
	var dropped []Key
	for k := range f.Intents {
		if key, err := parseKey(k); err == nil {
			dropped = append(dropped, key)
		}
	}
	if len(dropped) > 0 {
		if err := s.persist(); err != nil {
			return nil, nil, err
		}
	}
	return s, dropped, nil
}

func loadKey(path string) ([]byte, error) {
	b, err := diskio.ReadSecret(path)
	if err == nil && len(b) == 32 {
		return b, nil
	}
	if errors.Is(err, diskio.ErrNotOurs) {
		// A key others could have chosen or read (a link to their file, a file they may read or write) is no secret.
		if rerr := os.Rename(path, path+".corrupt"); rerr != nil {
			return nil, fmt.Errorf("access key %s: %v, and it cannot be moved aside: %w", path, err, rerr)
		}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	// A missing or damaged key makes every hash new: callers re-check once, nothing is granted by mistake.
	b = make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	if err := diskio.WriteFileAtomic(path, b, 0o600); err != nil {
		return nil, err
	}
	return b, nil
}

// HashCredential is the keyed hash (HMAC-SHA256 under the node's key) of the credential material presented to
// host. The material itself is never stored.
func (s *Store) HashCredential(host string, material []byte) string {
	m := hmac.New(sha256.New, s.hmacKey)
	m.Write([]byte(host))
	m.Write([]byte{0})
	m.Write(material)
	return hex.EncodeToString(m.Sum(nil))
}

// Records returns the records of k.
func (s *Store) Records(k Key) []Record {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.records[k])
}

// Has reports whether id has a record for k.
func (s *Store) Has(k Key, id Identity) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.ContainsFunc(s.records[k], func(r Record) bool { return r.same(id) })
}

// Intend records, durably, that a pull of k for id starts.
func (s *Store) Intend(k Key, id Identity) error {
	return s.change(func() bool {
		if slices.ContainsFunc(s.intents[k], func(r Record) bool { return r.same(id) }) {
			return false
		}
		s.intents[k] = append(s.intents[k], Record{Identity: id, Via: ViaPull, At: time.Now().UTC()})
		return true
	})
}

// Abandon drops id's intent on k (its pull failed).
func (s *Store) Abandon(k Key, id Identity) error {
	return s.change(func() bool { return dropIdentity(s.intents, k, id) })
}

// Add records, durably, that the registry served k to id, and ends id's intent on k.
func (s *Store) Add(k Key, id Identity, via Via) error {
	return s.change(func() bool {
		changed := dropIdentity(s.intents, k, id)
		recs := s.records[k]
		if i := slices.IndexFunc(recs, func(r Record) bool { return r.same(id) }); i >= 0 {
			if recs[i].Namespace == id.Namespace {
				return changed
			}
			recs = slices.Delete(slices.Clone(recs), i, i+1)
		}
		recs = append(slices.Clone(recs), Record{Identity: id, Via: via, At: time.Now().UTC()})
		if len(recs) > maxRecordsPerKey {
			recs = recs[len(recs)-maxRecordsPerKey:]
		}
		s.records[k] = recs
		return true
	})
}

// Forget drops the records of every digest keep refuses (content no longer on the node), so they do not grow
// without bound as models come and go.
func (s *Store) Forget(keep func(digest.Digest) bool) error {
	return s.change(func() bool {
		changed := false
		for k := range s.records {
			if !keep(k.Digest) {
				delete(s.records, k)
				changed = true
			}
		}
		return changed
	})
}

func dropIdentity(m map[Key][]Record, k Key, id Identity) bool {
	recs := m[k]
	i := slices.IndexFunc(recs, func(r Record) bool { return r.same(id) })
	if i < 0 {
		return false
	}
	if recs = slices.Delete(slices.Clone(recs), i, i+1); len(recs) == 0 {
		delete(m, k)
	} else {
		m[k] = recs
	}
	return true
}

// change applies fn under the lock and persists the result if fn changed anything; a failed write restores the
// records as they were, so memory never holds a grant the disk lacks.
func (s *Store) change(fn func() bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	records, intents := cloneMap(s.records), cloneMap(s.intents)
	if !fn() {
		return nil
	}
	if err := s.persist(); err != nil {
		s.records, s.intents = records, intents
		return fmt.Errorf("access records: %w", err)
	}
	return nil
}

func cloneMap(m map[Key][]Record) map[Key][]Record {
	c := make(map[Key][]Record, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func (s *Store) persist() error {
	f := file{Version: fileVersion, Records: map[string][]Record{}, Intents: map[string][]Record{}}
	for k, v := range s.records {
		f.Records[k.String()] = v
	}
	for k, v := range s.intents {
		f.Intents[k.String()] = v
	}
	b, err := json.MarshalIndent(f, "", " ")
	if err != nil {
		return err
	}
	return diskio.WriteFileAtomic(s.path, b, 0o600)
}

// parseKey reads host/repository@digest.
func parseKey(s string) (Key, error) {
	at := strings.LastIndex(s, "@")
	if at < 0 {
		return Key{}, fmt.Errorf("key %q has no digest", s)
	}
	d, err := digest.Parse(s[at+1:])
	if err != nil {
		return Key{}, err
	}
	host, repo, ok := strings.Cut(s[:at], "/")
	if !ok || host == "" || repo == "" {
		return Key{}, fmt.Errorf("key %q is not host/repository@digest", s)
	}
	return Key{Host: host, Repository: repo, Digest: d}, nil
}
