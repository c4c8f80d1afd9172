// Package access decides which callers may read content the node cache already holds: kubelet's "ensure secret
// pulled images" (KEP-2535) for models. The cache is shared by every pod on the node, so a digest on disk proves
// nothing about who may read it; what does is a record that the registry served that digest, under that
// registry host and repository, to that credential.
//
// A Store keeps those records, persisted in the driver's state (package state) and crash-safe (an intent before a
// pull, the record after it), with credentials reduced to a keyed hash. A Policy applies kubelet's
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
	"maps"
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

// Persistence is where a Store keeps its records: each key's list of records and of intents, as the Store encodes
// them (package state's Store).
type Persistence interface {
	// Access returns every list, by key.
	Access() (records, intents map[string][]byte, err error)
	// SetAccess commits the lists given durably, in one transaction; nil deletes a key's list.
	SetAccess(records, intents map[string][]byte) error
}

// Store is the records of one node, in memory for O(1) lookups and persisted on every change, one small
// transaction for the keys it changed; changes happen only when the registry was asked, so their cost hides behind
// that request. A lookup never waits for a change being persisted.
type Store struct {
	db      Persistence
	hmacKey []byte

	// wmu serialises changes; mu guards the maps, which a change replaces once persisted.
	wmu     sync.Mutex
	mu      sync.RWMutex
	records map[Key][]Record
	intents map[Key][]Record
}

// keyFile holds the node's secret key for credential hashes, apart from the records: the records alone allow no
// offline guessing of a credential.
const keyFile = "access.key"

// Open loads the records kept in db, with the key in dir (created on first use). Intents left by a crash are
// dropped: the pull they announced recorded nothing, so its caller checks with the registry at its next publish.
// Records that do not parse are dropped too (their callers check once more), as a lost state would be.
func Open(dir string, db Persistence) (*Store, []Key, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	key, err := loadKey(filepath.Join(dir, keyFile))
	if err != nil {
		return nil, nil, err
	}
	records, intents, err := db.Access()
	if err != nil {
		return nil, nil, fmt.Errorf("access records: %w", err)
	}
	s := &Store{db: db, hmacKey: key, records: map[Key][]Record{}, intents: map[Key][]Record{}}
	bad := map[string][]byte{}
	for k, b := range records {
		key, kerr := parseKey(k)
		var recs []Record
		if kerr == nil {
			kerr = json.Unmarshal(b, &recs)
		}
		if kerr != nil {
			bad[k] = nil
			continue
		}
		s.records[key] = recs
	}
	var dropped []Key
	stale := map[string][]byte{}
	for k := range intents {
		stale[k] = nil
		if key, err := parseKey(k); err == nil {
			dropped = append(dropped, key)
		}
	}
	if len(stale) > 0 || len(bad) > 0 {
		if err := db.SetAccess(bad, stale); err != nil {
			return nil, nil, fmt.Errorf("access records: %w", err)
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
	return s.change(func(records, intents map[Key][]Record) []Key {
		if slices.ContainsFunc(intents[k], func(r Record) bool { return r.same(id) }) {
			return nil
		}
		intents[k] = append(slices.Clone(intents[k]), Record{Identity: id, Via: ViaPull, At: time.Now().UTC()})
		return []Key{k}
	})
}

// Abandon drops id's intent on k (its pull failed).
func (s *Store) Abandon(k Key, id Identity) error {
	return s.change(func(_, intents map[Key][]Record) []Key {
		if !dropIdentity(intents, k, id) {
			return nil
		}
		return []Key{k}
	})
}

// Add records, durably, that the registry served k to id, and ends id's intent on k.
func (s *Store) Add(k Key, id Identity, via Via) error {
	return s.change(func(records, intents map[Key][]Record) []Key {
		changed := dropIdentity(intents, k, id)
		recs := records[k]
		if i := slices.IndexFunc(recs, func(r Record) bool { return r.same(id) }); i >= 0 {
			if recs[i].Namespace == id.Namespace {
				if !changed {
					return nil
				}
				return []Key{k}
			}
			recs = slices.Delete(slices.Clone(recs), i, i+1)
		}
		recs = append(slices.Clone(recs), Record{Identity: id, Via: via, At: time.Now().UTC()})
		if len(recs) > maxRecordsPerKey {
			recs = recs[len(recs)-maxRecordsPerKey:]
		}
		records[k] = recs
		return []Key{k}
	})
}

// Forget drops the records of every digest keep refuses (content no longer on the node), so they do not grow
// without bound as models come and go.
func (s *Store) Forget(keep func(digest.Digest) bool) error {
	return s.change(func(records, _ map[Key][]Record) []Key {
		var gone []Key
		for k := range records {
			if !keep(k.Digest) {
				delete(records, k)
				gone = append(gone, k)
			}
		}
		return gone
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

// change applies fn to copies of the maps and, if fn changed anything, persists the lists of the keys it returns
// before the copies replace the maps: memory never holds a grant the disk lacks, and lookups meanwhile read the
// maps as they were.
func (s *Store) change(fn func(records, intents map[Key][]Record) (changed []Key)) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.RLock()
	records, intents := maps.Clone(s.records), maps.Clone(s.intents)
	s.mu.RUnlock()
	changed := fn(records, intents)
	if len(changed) == 0 {
		return nil
	}
	recs, ints := map[string][]byte{}, map[string][]byte{}
	for _, k := range changed {
		recs[k.String()], ints[k.String()] = encode(records[k]), encode(intents[k])
	}
	if err := s.db.SetAccess(recs, ints); err != nil {
		return fmt.Errorf("access records: %w", err)
	}
	s.mu.Lock()
	s.records, s.intents = records, intents
	s.mu.Unlock()
	return nil
}

// encode is a key's list as persisted; nil (deleted) when it is empty.
func encode(recs []Record) []byte {
	if len(recs) == 0 {
		return nil
	}
	b, err := json.Marshal(recs)
	if err != nil {
		panic(fmt.Sprintf("access: marshal: %v", err))
	}
	return b
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
