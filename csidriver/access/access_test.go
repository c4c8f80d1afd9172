package access

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/csidriver/state"
	"github.com/modelpack/modelpack/internal/testenv"
)

var (
	dgst  = digest.FromString("model")
	key   = Key{Host: "registry.example.com", Repository: "models/llama", Digest: dgst}
	alice = Identity{Kind: Secret, Hash: "aa", Namespace: "team-a"}
	bob   = Identity{Kind: Secret, Hash: "bb", Namespace: "team-b"}
)

// open opens the records of the state in dir, closing the state an earlier open of dir left open (a restart).
func open(t *testing.T, dir string) (*Store, []Key) {
	t.Helper()
	openMu.Lock()
	defer openMu.Unlock()
	if st := opened[dir]; st != nil {
		st.Close()
	}
	st, err := state.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	opened[dir] = st
	t.Cleanup(func() { st.Close() })
	s, dropped, err := Open(dir, st)
	if err != nil {
		t.Fatal(err)
	}
	return s, dropped
}

var (
	openMu sync.Mutex
	opened = map[string]*state.Store{}
)

// memory is a Persistence in memory that can be made to fail.
type memory struct {
	records, intents map[string][]byte
	fail             error
}

func (m *memory) Access() (map[string][]byte, map[string][]byte, error) {
	return maps.Clone(m.records), maps.Clone(m.intents), nil
}

func (m *memory) SetAccess(records, intents map[string][]byte) error {
	if m.fail != nil {
		return m.fail
	}
	for into, from := range map[*map[string][]byte]map[string][]byte{&m.records: records, &m.intents: intents} {
		if *into == nil {
			*into = map[string][]byte{}
		}
		for k, v := range from {
			if v == nil {
				delete(*into, k)
			} else {
				(*into)[k] = v
			}
		}
	}
	return nil
}

// Records survive a restart; an intent left by a crash grants nothing and is dropped, named.
func TestRecordsPersistAndIntentsGrantNothing(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir)
	if err := s.Add(key, alice, ViaPull); err != nil {
		t.Fatal(err)
	}
	other := Key{Host: key.Host, Repository: "models/other", Digest: dgst}
	if err := s.Intend(other, bob); err != nil {
		t.Fatal(err)
	}
	if s.Has(other, bob) {
		t.Fatal("an intent counts as a record")
	}

	s2, dropped := open(t, dir)
	if !s2.Has(key, alice) || s2.Has(key, bob) {
		t.Fatalf("records after a restart: %+v", s2.Records(key))
	}
	if len(dropped) != 1 || dropped[0] != other {
		t.Fatalf("dropped intents %v, want [%v]", dropped, other)
	}
	if s2.Has(other, bob) {
		t.Fatal("a crashed pull's intent became a record")
	}
	if _, dropped := open(t, dir); len(dropped) != 0 {
		t.Fatalf("dropped intents were not forgotten: %v", dropped)
	}
	// Another name for the same digest is another key.
	if s2.Has(Key{Host: "attacker.invalid", Repository: key.Repository, Digest: dgst}, alice) {
		t.Fatal("a record under one host answers for another")
	}
}

// Add ends the intent of the same credential; Abandon drops it; the same credential is recorded once.
func TestIntentLifecycle(t *testing.T) {
	s, _ := open(t, t.TempDir())
	for _, step := range []func() error{
		func() error { return s.Intend(key, alice) },
		func() error { return s.Add(key, alice, ViaPull) },
		func() error { return s.Add(key, alice, ViaCheck) },
		func() error { return s.Intend(key, bob) },
		func() error { return s.Abandon(key, bob) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(s.Records(key)); n != 1 {
		t.Fatalf("%d records, want 1: %+v", n, s.Records(key))
	}
	if len(s.intents) != 0 {
		t.Fatalf("intents left: %+v", s.intents)
	}
}

// Credentials are stored as a keyed hash: the state holds neither the credential nor its plain sha256, and a
// node with another key hashes the same credential differently (no table of guesses carries over).
func TestCredentialHashIsKeyed(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir)
	secret := []byte("5:alice7:hunter2")
	h := s.HashCredential("r.example", secret)
	if h != s.HashCredential("r.example", secret) || h == s.HashCredential("other.example", secret) {
		t.Fatal("the hash is not a function of the host and the credential")
	}
	if err := s.Add(key, Identity{Kind: Secret, Hash: h}, ViaPull); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte("hunter2")) || !bytes.Contains(b, []byte(h)) {
		t.Fatal("the state holds the credential, or not its hash")
	}
	fi, err := os.Stat(filepath.Join(dir, keyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	if s2, _ := open(t, dir); s2.HashCredential("r.example", secret) != h {
		t.Fatal("the key changed across a restart")
	}
	if s3, _ := open(t, t.TempDir()); s3.HashCredential("r.example", secret) == h {
		t.Fatal("two nodes share a key")
	}
}

// Records that do not parse grant nothing and are dropped; the others stay.
func TestUnreadableRecordsAreDropped(t *testing.T) {
	good, _ := json.Marshal([]Record{{Identity: alice, Via: ViaPull}})
	m := &memory{records: map[string][]byte{key.String(): good, "no digest": good, "registry.example.com/x@" + dgst.String(): []byte(`[{`)}}
	s, _, err := Open(t.TempDir(), m)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Has(key, alice) || len(m.records) != 1 {
		t.Fatalf("after unreadable records: has=%v, persisted %s", s.Has(key, alice), m.records)
	}
}

// A write that fails changes nothing in memory either: no grant the disk lacks.
func TestFailedWriteGrantsNothing(t *testing.T) {
	m := &memory{}
	s, _, err := Open(t.TempDir(), m)
	if err != nil {
		t.Fatal(err)
	}
	m.fail = errors.New("disk full")
	if err := s.Add(key, alice, ViaPull); !errors.Is(err, m.fail) {
		t.Fatalf("got %v", err)
	}
	if s.Has(key, alice) {
		t.Fatal("a failed write left the grant in memory")
	}
}

// A change persists only the keys it changes, in one transaction: a cold pull's intent and record are two small
// writes, not two rewrites of every record.
func TestChangesPersistOnlyTheirKey(t *testing.T) {
	m := &memory{}
	s, _, err := Open(t.TempDir(), m)
	if err != nil {
		t.Fatal(err)
	}
	var calls []int
	counting := &counter{memory: m, calls: &calls}
	s.db = counting
	otherKey := Key{Host: key.Host, Repository: "models/other", Digest: dgst}
	for _, step := range []func() error{
		func() error { return s.Add(otherKey, bob, ViaPull) },
		func() error { return s.Intend(key, alice) },
		func() error { return s.Add(key, alice, ViaPull) },
		func() error { return s.Add(key, alice, ViaPull) }, // no change: no write
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(calls, []int{1, 1, 1}) {
		t.Fatalf("keys per write: %v, want one write of one key per change", calls)
	}
}

type counter struct {
	*memory
	calls *[]int
}

func (c *counter) SetAccess(records, intents map[string][]byte) error {
	keys := map[string]bool{}
	for k := range records {
		keys[k] = true
	}
	for k := range intents {
		keys[k] = true
	}
	*c.calls = append(*c.calls, len(keys))
	return c.memory.SetAccess(records, intents)
}

// Changes from many goroutines at once, beside lookups, all persist (run under -race).
func TestConcurrentChangesAllPersist(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir)
	const n = 16
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(2)
		k := Key{Host: key.Host, Repository: fmt.Sprintf("models/m%d", i%4), Digest: dgst}
		id := Identity{Kind: Secret, Hash: fmt.Sprintf("h%d", i)}
		go func() {
			defer wg.Done()
			for _, step := range []func() error{
				func() error { return s.Intend(k, id) },
				func() error { return s.Add(k, id, ViaPull) },
				func() error { return s.Intend(k, Identity{Kind: Node}) },
				func() error { return s.Abandon(k, Identity{Kind: Node}) },
			} {
				if err := step(); err != nil {
					t.Error(err)
				}
			}
		}()
		go func() {
			defer wg.Done()
			s.Has(k, id)
			s.Records(k)
		}()
	}
	wg.Wait()
	s2, dropped := open(t, dir)
	if len(dropped) != 0 {
		t.Fatalf("intents left: %v", dropped)
	}
	for i := range n {
		k := Key{Host: key.Host, Repository: fmt.Sprintf("models/m%d", i%4), Digest: dgst}
		if !s2.Has(k, Identity{Kind: Secret, Hash: fmt.Sprintf("h%d", i)}) {
			t.Errorf("record %d lost", i)
		}
	}
}

func TestForgetAndCap(t *testing.T) {
	s, _ := open(t, t.TempDir())
	gone := Key{Host: key.Host, Repository: key.Repository, Digest: digest.FromString("evicted")}
	for i := range maxRecordsPerKey + 3 {
		id := Identity{Kind: Secret, Hash: strings.Repeat("x", i+1)}
		if err := s.Add(key, id, ViaCheck); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(s.Records(key)); n != maxRecordsPerKey {
		t.Fatalf("%d records, want the cap %d", n, maxRecordsPerKey)
	}
	if s.Has(key, Identity{Kind: Secret, Hash: "x"}) {
		t.Fatal("the oldest record was kept past the cap")
	}
	if err := s.Add(gone, alice, ViaPull); err != nil {
		t.Fatal(err)
	}
	if err := s.Forget(func(d digest.Digest) bool { return d == dgst }); err != nil {
		t.Fatal(err)
	}
	if s.Has(gone, alice) || len(s.Records(key)) == 0 {
		t.Fatal("Forget dropped the wrong records")
	}
}

func TestIdentityStringsRevealNoCredential(t *testing.T) {
	id := Identity{Kind: Secret, Hash: strings.Repeat("ab", 32), Namespace: "team-a"}
	s := id.String()
	if strings.Contains(s, id.Hash) || !strings.Contains(s, "team-a") || !strings.Contains(s, id.Hash[:12]) {
		t.Fatalf("%q", s)
	}
}

// A key that is not a regular file the driver wrote (a link to a forged file elsewhere, a file others may read,
// write or own, a FIFO) is set aside and not believed: real files, a real link, a real FIFO. (Forged records are
// package state's.)
func TestForgedFilesAreSetAside(t *testing.T) {
	forger := t.TempDir()
	f, _ := open(t, forger)
	if err := f.Add(key, alice, ViaPull); err != nil {
		t.Fatal(err)
	}
	forgedHash := f.HashCredential("registry.example.com", []byte("secret"))
	plant := map[string]func(t *testing.T, p, forged string){
		"a link to a forged file": func(t *testing.T, p, forged string) {
			if err := os.Symlink(forged, p); err != nil {
				t.Fatal(err)
			}
		},
		"a file others may write": func(t *testing.T, p, forged string) {
			b, _ := os.ReadFile(forged)
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			os.Chmod(p, 0o666)
		},
		"a file of another user": func(t *testing.T, p, forged string) {
			testenv.RequireRoot(t) // to give a file away
			b, _ := os.ReadFile(forged)
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		},
		"a file others may read (the key)": func(t *testing.T, p, forged string) {
			b, _ := os.ReadFile(forged)
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			os.Chmod(p, 0o644)
		},
		"a FIFO": func(t *testing.T, p, _ string) {
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, put := range plant {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			open(t, dir)
			p := filepath.Join(dir, keyFile)
			os.Remove(p)
			put(t, p, filepath.Join(forger, keyFile))
			s, _ := open(t, dir)
			if s.HashCredential("registry.example.com", []byte("secret")) == forgedHash {
				t.Error("forged key used")
			}
			if _, err := os.Lstat(p + ".corrupt"); err != nil {
				t.Errorf("not set aside: %v", err)
			}
		})
	}
	if g, _ := open(t, forger); !g.Has(key, alice) {
		t.Fatal("the forger's state itself was changed")
	}
}
