package state

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
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
	if err := s.Update(func(st *State) error {
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
	if entries, _ := os.ReadDir(filepath.Dir(p)); len(entries) != 2 {
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

// Volume records and the rest live in two documents, and an update rewrites only the one it changes: recording a
// publish never replaces (nor flushes) state.json, and recording an image never replaces volumes.json.
func TestUpdateRewritesOnlyTheDocumentItChanges(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	s, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	image := func(st *State) error { st.Images["r|"] = Image{Reference: "r", Digest: "sha256:x"}; return nil }
	volume := func(target string) func(*State) error {
		return func(st *State) error { st.Volumes[target] = Volume{VolumeID: "v", TargetPath: target}; return nil }
	}
	if err := s.Update(image); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(volume("/t1")); err != nil {
		t.Fatal(err)
	}
	stat := func(name string) os.FileInfo {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}
	durable, volumes := stat("state.json"), stat("volumes.json")
	if err := s.Update(volume("/t2")); err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(durable, stat("state.json")) {
		t.Error("recording a volume replaced state.json")
	}
	if os.SameFile(volumes, stat("volumes.json")) {
		t.Error("recording a volume did not replace volumes.json")
	}
	volumes = stat("volumes.json")
	if err := s.Update(func(st *State) error { st.Pulls["k"] = Pull{Reference: "r"}; return nil }); err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(volumes, stat("volumes.json")) {
		t.Error("recording a pull replaced volumes.json")
	}
	if b, _ := os.ReadFile(p); strings.Contains(string(b), "/t1") {
		t.Errorf("state.json holds volumes: %s", b)
	}
	re, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if st := re.Snapshot(); len(st.Volumes) != 2 || st.Images["r|"].Digest != "sha256:x" || len(st.Pulls) != 1 {
		t.Fatalf("reopened state: %+v", st)
	}
}

// A state.json written before volumes.json existed holds the volumes: they are read, and move to volumes.json at
// the next update. Once volumes.json exists it is the record over the state.json it took them from (a driver killed
// between writing the two), not over one a driver from before volumes.json wrote since (a downgrade).
func TestLegacyStateVolumesMoveToTheirDocument(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	legacy := `{"volumes": {"/old": {"volumeId": "v", "targetPath": "/old", "phase": "published"}},
		"images": {"r|": {"reference": "r", "digest": "sha256:x"}}}`
	if err := os.WriteFile(p, []byte(legacy), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if st := s.Snapshot(); st.Volumes["/old"].VolumeID != "v" || st.Images["r|"].Digest != "sha256:x" {
		t.Fatalf("legacy state read as %+v", st)
	}
	if err := s.Update(func(st *State) error { st.Pulls["k"] = Pull{Reference: "r"}; return nil }); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); strings.Contains(string(b), "/old") {
		t.Errorf("state.json still holds the volumes after an update: %s", b)
	}
	re, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if st := re.Snapshot(); st.Volumes["/old"].VolumeID != "v" || st.Images["r|"].Digest != "sha256:x" || len(st.Pulls) != 1 {
		t.Fatalf("migrated state reopened as %+v", st)
	}

	// Killed after writing volumes.json and before replacing the legacy state.json: volumes.json wins.
	if err := os.WriteFile(p, []byte(legacy), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := re.Update(func(st *State) error { delete(st.Volumes, "/old"); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(legacy), 0o600); err != nil {
		t.Fatal(err)
	}
	again, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if st := again.Snapshot(); len(st.Volumes) != 0 {
		t.Fatalf("a legacy state.json's volumes overrode volumes.json: %+v", st.Volumes)
	}

	// Downgraded, the driver of before volumes.json recorded a volume in state.json; upgraded again, that state.json
	// is the record, volumes.json older, and the volume moves over at the next update.
	downgraded := `{"volumes": {"/later": {"volumeId": "w", "targetPath": "/later", "phase": "published"}},
		"images": {"r|": {"reference": "r", "digest": "sha256:x"}}}`
	if err := os.WriteFile(p, []byte(downgraded), 0o600); err != nil {
		t.Fatal(err)
	}
	up, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if st := up.Snapshot(); len(st.Volumes) != 1 || st.Volumes["/later"].VolumeID != "w" {
		t.Fatalf("after a downgrade and an upgrade: volumes %+v; want the downgraded driver's /later", st.Volumes)
	}
	if err := up.Update(func(st *State) error { st.Pulls["k2"] = Pull{Reference: "r"}; return nil }); err != nil {
		t.Fatal(err)
	}
	final, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if st := final.Snapshot(); len(st.Volumes) != 1 || st.Volumes["/later"].VolumeID != "w" {
		t.Fatalf("reopened after the migration: volumes %+v", st.Volumes)
	}
	if b, _ := os.ReadFile(p); strings.Contains(string(b), "/later") {
		t.Errorf("state.json still holds the volumes after an update: %s", b)
	}
}

// A volumes.json that does not parse is set aside like a corrupt state.json: the caller is told (the driver then
// treats its state as lost), the rest of the state is kept.
func TestCorruptVolumesAreSetAside(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	s, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Update(func(st *State) error { st.Images["r|"] = Image{Reference: "r", Digest: "sha256:x"}; return nil }); err != nil {
		t.Fatal(err)
	}
	vp := filepath.Join(dir, "volumes.json")
	if err := os.WriteFile(vp, []byte(`{"volumes": {"/t": `), 0o600); err != nil {
		t.Fatal(err)
	}
	re, err := Open(p)
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Path != vp || re == nil {
		t.Fatalf("got %v, want a CorruptError for %s and a usable store", err, vp)
	}
	if st := re.Snapshot(); len(st.Volumes) != 0 || st.Images["r|"].Digest != "sha256:x" {
		t.Fatalf("after a corrupt volumes.json: %+v", st)
	}
	if _, err := os.Stat(vp + ".corrupt"); err != nil {
		t.Fatalf("corrupt volumes.json not kept for inspection: %v", err)
	}
}

// A state document replaced by a link to a forged one elsewhere, or by a file others may write, is set aside (the
// link itself, not what it points to) and not believed.
func TestForgedStateIsSetAside(t *testing.T) {
	forger := t.TempDir()
	f, err := Open(filepath.Join(forger, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Update(func(st *State) error {
		st.Volumes["/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/m/mount"] = Volume{VolumeID: "forged"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{"state.json", "volumes.json"} {
		for _, how := range []string{"link", "writable"} {
			dir := t.TempDir()
			p := filepath.Join(dir, doc)
			forged := filepath.Join(forger, doc)
			if how == "link" {
				if err := os.Symlink(forged, p); err != nil {
					t.Fatal(err)
				}
			} else {
				b, _ := os.ReadFile(forged)
				os.WriteFile(p, b, 0o600)
				os.Chmod(p, 0o666)
			}
			if doc == "state.json" {
				// A volumes.json of ours beside it: only state.json is forged.
				os.WriteFile(filepath.Join(dir, "volumes.json"), []byte(`{"volumes": {}}`), 0o600)
			}
			s, err := Open(filepath.Join(dir, "state.json"))
			var ce *CorruptError
			if !errors.As(err, &ce) || s == nil {
				t.Fatalf("%s %s: got %v, want a CorruptError and a usable store", doc, how, err)
			}
			if len(s.Snapshot().Volumes) != 0 {
				t.Errorf("%s %s: forged volumes believed", doc, how)
			}
			if _, err := os.Lstat(p + ".corrupt"); err != nil {
				t.Errorf("%s %s: not set aside: %v", doc, how, err)
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(forger, "volumes.json")); err != nil || !strings.Contains(string(b), "forged") {
		t.Fatalf("the forged document itself changed: %v", err)
	}
}
