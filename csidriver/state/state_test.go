package state

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

const boot = "boot-1"

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := openAt(dir, boot, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func update(t *testing.T, s *Store, fn func(*State)) {
	t.Helper()
	if err := s.Update(func(st *State) error { fn(st); return nil }); err != nil {
		t.Fatal(err)
	}
}

func TestUpdatePersistsAndRollsBack(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "csi")
	s := open(t, dir)
	update(t, s, func(st *State) { st.Volumes["/t"] = Volume{VolumeID: "v", TargetPath: "/t", Phase: PhasePublished} })
	boom := errors.New("boom")
	if err := s.Update(func(st *State) error {
		delete(st.Volumes, "/t")
		return boom
	}); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	update(t, s, func(st *State) { st.Images["r|"] = Image{Reference: "r", Digest: "sha256:x"} })
	// Callers get copies: changing one changes nothing stored.
	s.Snapshot().Volumes["/t"] = Volume{VolumeID: "changed"}
	s.Close()

	st := open(t, dir).Snapshot()
	if st.Volumes["/t"].VolumeID != "v" || st.Images["r|"].Digest != "sha256:x" {
		t.Fatalf("reopened state: %+v", st)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "state.db volumes" {
		t.Fatalf("state directory holds %v", names)
	}
}

// txID is the last transaction committed in db.
func txID(db *bolt.DB) (id int) {
	db.View(func(tx *bolt.Tx) error { id = tx.ID(); return nil })
	return id
}

// An update commits only in the file it changes: recording a publish never commits (nor flushes) state.db, and
// recording an image never commits in the volumes' file; a delete removes the record.
func TestUpdateCommitsOnlyWhatItChanges(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	update(t, s, func(st *State) { st.Images["r|"] = Image{Reference: "r", Digest: "sha256:x"} })
	durable, vols := txID(s.db), txID(s.vols)
	update(t, s, func(st *State) { st.Volumes["/t1"] = Volume{VolumeID: "v", TargetPath: "/t1"} })
	update(t, s, func(st *State) { st.Volumes["/t2"] = Volume{VolumeID: "v", TargetPath: "/t2"} })
	if txID(s.db) != durable || txID(s.vols) != vols+2 {
		t.Fatalf("two volumes recorded: state.db at transaction %d (was %d), volumes at %d (was %d)", txID(s.db), durable, txID(s.vols), vols)
	}
	update(t, s, func(st *State) { st.Pulls["k"] = Pull{Reference: "r"} })
	update(t, s, func(*State) {})
	if txID(s.vols) != vols+2 || txID(s.db) != durable+1 {
		t.Fatal("a pull, then nothing, committed in the wrong file")
	}
	update(t, s, func(st *State) { delete(st.Volumes, "/t1") })
	s.Close()
	if st := open(t, dir).Snapshot(); len(st.Volumes) != 1 || st.Volumes["/t2"].VolumeID != "v" || st.Images["r|"].Digest != "sha256:x" || len(st.Pulls) != 1 {
		t.Fatalf("reopened state: %+v", st)
	}
}

// Volume records last the boot that wrote them, as the mounts they stand for; the rest survives a restart of the
// machine.
func TestVolumeRecordsLastTheBoot(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	update(t, s, func(st *State) {
		st.Volumes["/t"] = Volume{VolumeID: "v", TargetPath: "/t", Phase: PhasePublished}
		st.ControllerVolumes["pvc"] = ControllerVolume{ID: "pvc"}
	})
	s.Close()
	next, err := openAt(dir, "boot-2", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if st := next.Snapshot(); len(st.Volumes) != 0 || st.ControllerVolumes["pvc"].ID != "pvc" {
		t.Fatalf("after a restart of the machine: %+v", st)
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, volumesDir)); len(entries) != 1 || entries[0].Name() != "boot-2.db" {
		t.Fatalf("volume files: %v", entries)
	}
}

// A state.db that is not a database, or not ours (a link to a forged one elsewhere, a file others may write), is
// set aside and not believed: the caller is told (the driver then treats its state as lost) and the store works.
func TestUnbelievableStateIsSetAside(t *testing.T) {
	forger := t.TempDir()
	f := open(t, forger)
	update(t, f, func(st *State) { st.Images["forged|"] = Image{Reference: "forged"} })
	f.Close()
	for name, plant := range map[string]func(p string){
		"garbage": func(p string) { os.WriteFile(p, []byte(`{"volumes": {`), 0o600) },
		"link":    func(p string) { os.Symlink(filepath.Join(forger, stateFile), p) },
		"writable": func(p string) {
			b, _ := os.ReadFile(filepath.Join(forger, stateFile))
			os.WriteFile(p, b, 0o600)
			os.Chmod(p, 0o666)
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, stateFile)
			plant(p)
			s, err := openAt(dir, boot, nil)
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Path != p || s == nil {
				t.Fatalf("got %v, want a CorruptError for %s and a usable store", err, p)
			}
			defer s.Close()
			if len(s.Snapshot().Images) != 0 {
				t.Fatal("forged records believed")
			}
			if _, err := os.Lstat(p + ".corrupt"); err != nil {
				t.Fatalf("not kept for inspection: %v", err)
			}
			update(t, s, func(st *State) { st.Images["r|"] = Image{Reference: "r"} })
		})
	}
	if st := open(t, forger).Snapshot(); st.Images["forged|"].Reference != "forged" {
		t.Fatal("the forged file itself changed")
	}
}

// A state file of a newer schema version (a newer driver wrote it, then this one was rolled back) is refused,
// named, and left as it was.
func TestNewerStateIsRefused(t *testing.T) {
	for _, file := range []string{stateFile, filepath.Join(volumesDir, boot+".db")} {
		t.Run(filepath.Base(file), func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir)
			s.Close()
			p := filepath.Join(dir, file)
			db, err := bolt.Open(p, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("schema")).Put([]byte("version"), []byte("7")) })
			db.Close()
			_, err = openAt(dir, boot, nil)
			if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "schema version 7") || !strings.Contains(err.Error(), "up to 1") {
				t.Fatalf("got %v, want a refusal naming %s, its version 7 and the latest known, 1", err, p)
			}
			if _, err := os.Stat(p); err != nil {
				t.Fatalf("the refused file was removed: %v", err)
			}
		})
	}
}

// Updates from many goroutines at once, beside snapshots, all persist in their file (run under -race).
func TestConcurrentUpdatesAllPersist(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	const n = 16
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for _, fn := range []func(*State) error{
				func(st *State) error { st.Volumes[fmt.Sprint("/t", i)] = Volume{VolumeID: fmt.Sprint(i)}; return nil },
				func(st *State) error { st.Images[fmt.Sprint("r", i)] = Image{Reference: fmt.Sprint(i)}; return nil },
			} {
				if err := s.Update(fn); err != nil {
					t.Error(err)
				}
			}
		}()
		go func() {
			defer wg.Done()
			s.Snapshot()
		}()
	}
	wg.Wait()
	s.Close()
	if st := open(t, dir).Snapshot(); len(st.Volumes) != n || len(st.Images) != n {
		t.Fatalf("after %d concurrent updates of each: %d volumes, %d images", n, len(st.Volumes), len(st.Images))
	}
}

// BenchmarkRecordVolume is what a publish costs the state: one volume recorded beside a few hundred others.
func BenchmarkRecordVolume(b *testing.B) {
	s, err := openAt(b.TempDir(), boot, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	s.Update(func(st *State) error {
		for i := range 300 {
			t := fmt.Sprintf("/var/lib/kubelet/pods/%d/volumes/kubernetes.io~csi/m/mount", i)
			st.Volumes[t] = Volume{VolumeID: "v", TargetPath: t, Attributes: map[string]string{"reference": "r"}, Phase: PhasePublished}
		}
		return nil
	})
	for i := 0; b.Loop(); i++ {
		if err := s.Update(func(st *State) error {
			st.Volumes["/t"] = Volume{VolumeID: fmt.Sprint(i), TargetPath: "/t", Phase: PhasePublished}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
}
