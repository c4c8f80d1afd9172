package access

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/internal/testenv"
)

var (
	dgst  = digest.FromString("model")
	key   = Key{Host: "registry.example.com", Repository: "models/llama", Digest: dgst}
	alice = Identity{Kind: Secret, Hash: "aa", Namespace: "team-a"}
	bob   = Identity{Kind: Secret, Hash: "bb", Namespace: "team-b"}
)

func open(t *testing.T, dir string) (*Store, []Key) {
	t.Helper()
	s, dropped, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s, dropped
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

// Credentials are stored as a keyed hash: the file holds neither the credential nor its plain sha256, and a
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
	b, err := os.ReadFile(filepath.Join(dir, recordsFile))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte("hunter2")) || !bytes.Contains(b, []byte(h)) {
		t.Fatalf("records file: %s", b)
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

// A records file that does not parse is set aside: nothing is granted from it, the driver still starts.
func TestCorruptRecordsAreSetAside(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir)
	if err := s.Add(key, alice, ViaPull); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, recordsFile), []byte(`{"records": {`), 0o600); err != nil {
		t.Fatal(err)
	}
	s2, _ := open(t, dir)
	if s2.Has(key, alice) {
		t.Fatal("granted from a corrupt file")
	}
	if _, err := os.Stat(filepath.Join(dir, recordsFile+".corrupt")); err != nil {
		t.Fatal(err)
	}
}

// A write that fails changes nothing in memory either: no grant the disk lacks.
func TestFailedWriteGrantsNothing(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir)
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(dir, 0o700)
	if os.Geteuid() == 0 {
		// root writes through the mode bits: point the store at a directory that does not exist instead.
		s.path = filepath.Join(dir, "gone", recordsFile)
	}
	if err := s.Add(key, alice, ViaPull); err == nil {
		t.Fatal("the write succeeded")
	}
	if s.Has(key, alice) {
		t.Fatal("a failed write left the grant in memory")
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

// Records or a key that are not a regular file the driver wrote (a link to a forged file elsewhere, a file others
// may write or own, a FIFO) are set aside and not believed: real files, a real link, a real FIFO.
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
			for _, file := range []string{recordsFile, keyFile} {
				if strings.HasSuffix(name, "(the key)") && file != keyFile {
					continue // records are no secret: the node's key keeps credentials from being guessed
				}
				dir := t.TempDir()
				open(t, dir)
				p := filepath.Join(dir, file)
				os.Remove(p)
				put(t, p, filepath.Join(forger, file))
				s, _ := open(t, dir)
				if s.Has(key, alice) {
					t.Errorf("%s: forged records believed", file)
				}
				if file == keyFile && s.HashCredential("registry.example.com", []byte("secret")) == forgedHash {
					t.Errorf("%s: forged key used", file)
				}
				if _, err := os.Lstat(p + ".corrupt"); err != nil {
					t.Errorf("%s: not set aside: %v", file, err)
				}
			}
		})
	}
	if g, _ := open(t, forger); !g.Has(key, alice) {
		t.Fatal("the forged files themselves were changed")
	}
}
