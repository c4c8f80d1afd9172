package state

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestUpdatePersistsAndRollsBack(t *testing.T) {
	p := filepath.Join(t.TempDir(), "csi", "state.json")
	s, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Update(func(st *State) error {
		st.Volumes["/t"] = Volume{VolumeID: "v", TargetPath: "/t", Phase: PhasePublished}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := s.Update(func(st *State) error {
		delete(st.Volumes, "/t")
		return boom
	}); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if err := s.UpdateNoSync(func(st *State) error {
		st.Images["r|"] = Image{Reference: "r", Digest: "sha256:x"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Callers get copies: changing one changes nothing stored.
	s.Snapshot().Volumes["/t"] = Volume{VolumeID: "changed"}

	re, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	st := re.Snapshot()
	if st.Volumes["/t"].VolumeID != "v" || st.Images["r|"].Digest != "sha256:x" {
		t.Fatalf("reopened state: %+v", st)
	}
	if entries, _ := os.ReadDir(filepath.Dir(p)); len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
}

func TestCorruptStateIsSetAside(t *testing.T) {
	p := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(p, []byte(`{"volumes": {`), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(p)
	var ce *CorruptError
	if !errors.As(err, &ce) || s == nil {
		t.Fatalf("got %v, want a CorruptError and a usable store", err)
	}
	if len(s.Snapshot().Volumes) != 0 {
		t.Fatal("corrupt state not replaced by an empty one")
	}
	if _, err := os.Stat(p + ".corrupt"); err != nil {
		t.Fatalf("corrupt state not kept for inspection: %v", err)
	}
	if err := s.Update(func(st *State) error { return nil }); err != nil {
		t.Fatal(err)
	}
}
