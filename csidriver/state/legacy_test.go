package state

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	digest "github.com/opencontainers/go-digest"
)

// released copies the documents the last release before state.db wrote (testdata/released, made by that
// release's state and access packages) into a state directory, as the driver left them.
func released(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{legacyState, legacyVolumes, legacyAccess, "access.key"} {
		b, err := os.ReadFile(filepath.Join("testdata", "released", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

const (
	targetA = "/var/lib/kubelet/pods/uid-a/volumes/kubernetes.io~csi/model/mount"
	targetB = "/var/lib/kubelet/pods/uid-b/volumes/kubernetes.io~csi/model/mount"
	llama   = "registry.example.com/models/llama@sha256:05b3abf2579a5eb66403cd78be557fd860633a1fe2103c7642030defe32c657f"
	other   = "registry.example.com/models/other@sha256:d9298a10d1b0735837dc4bd85dac641b0f3cef27a47e5d53a54f2f3f5b2fcffa"
	big     = "registry.example.com/models/big@sha256:2a21fe6d592a19b7de898b50eb53c429608de1a66f3e9f62da19714a770553d1"
)

// checkReleased asserts that s holds exactly what testdata/released recorded.
func checkReleased(t *testing.T, s *Store) {
	t.Helper()
	st := s.Snapshot()
	if len(st.Volumes) != 2 || st.Volumes[targetA].Phase != PhasePublished || st.Volumes[targetB].Phase != PhaseMounting ||
		st.Volumes[targetA].Pod.Name != "pod-a" || !st.Volumes[targetA].Ephemeral || st.Volumes[targetB].Owner != "csi:"+targetB {
		t.Errorf("volumes: %+v", st.Volumes)
	}
	img := st.Images["registry.example.com/models/llama:v1|"]
	if len(st.Images) != 1 || img.Manifest != "sha256:05b3abf2579a5eb66403cd78be557fd860633a1fe2103c7642030defe32c657f" || img.ResolvedAt.IsZero() {
		t.Errorf("images: %+v", st.Images)
	}
	if p := st.Pulls["registry.example.com/models/big:v2|linux/amd64"]; len(st.Pulls) != 1 || p.Platform != "linux/amd64" {
		t.Errorf("pulls: %+v", st.Pulls)
	}
	if cv := st.ControllerVolumes["pvc-1"]; len(st.ControllerVolumes) != 1 || cv.CapacityBytes != 1<<30 || cv.Parameters["reference"] == "" {
		t.Errorf("controller volumes: %+v", st.ControllerVolumes)
	}
	records, intents, err := s.Access()
	if err != nil {
		t.Fatal(err)
	}
	count := func(b []byte) int {
		var l []map[string]any
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatal(err)
		}
		return len(l)
	}
	if len(records) != 2 || count(records[llama]) != 2 || count(records[other]) != 1 {
		t.Errorf("access records: %s", records)
	}
	if len(intents) != 1 || count(intents[big]) != 1 {
		t.Errorf("access intents: %s", intents)
	}
}

func checkImported(t *testing.T, dir string) {
	t.Helper()
	for _, name := range []string{legacyState, legacyVolumes, legacyAccess} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after the import: %v", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "access.key")); err != nil {
		t.Errorf("the access key is gone: %v", err)
	}
}

// A node upgraded in place keeps its published volumes, images, pulls, controller volumes and access records: the
// released documents are imported at the first open and removed, and a later open finds them in state.db.
func TestReleasedDocumentsAreImported(t *testing.T) {
	dir := t.TempDir()
	released(t, dir)
	s, err := openAt(dir, boot, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkReleased(t, s)
	checkImported(t, dir)
	s.Close()
	checkReleased(t, open(t, dir))
}

const crashEnv = "MODELPACK_STATE_CRASH_DIR"

// Killed between the import's commit and the removal of the documents: the next open imports them again over
// the records already there (nothing duplicated, nothing lost) and removes them. The kill is a SIGKILL of a child
// process at that point.
func TestImportKilledBeforeRemovalIsRedone(t *testing.T) {
	if dir := os.Getenv(crashEnv); dir != "" {
		openAt(dir, boot, func() { syscall.Kill(os.Getpid(), syscall.SIGKILL) })
		t.Fatal("not killed")
	}
	dir := t.TempDir()
	released(t, dir)
	cmd := exec.Command(os.Args[0], "-test.run=^TestImportKilledBeforeRemovalIsRedone$")
	cmd.Env = append(os.Environ(), crashEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the child was not killed at the hook: %v\n%s", err, out)
	}
	for _, name := range []string{legacyState, legacyVolumes, legacyAccess} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Fatalf("%s gone before the child was killed: %v", name, err)
		}
	}
	s := open(t, dir)
	checkReleased(t, s)
	checkImported(t, dir)
}

// Older layouts: a state.json from before volumes.json held the volumes itself; once volumes.json existed it was
// the record over the state.json it took them from (a driver killed between writing the two), not over one a
// driver from before volumes.json wrote since (a downgrade). An access.json of version 1 grants nothing.
func TestOlderLayoutsAreImported(t *testing.T) {
	legacy := `{"volumes": {"/old": {"volumeId": "v", "targetPath": "/old", "phase": "published"}},
		"images": {"r|": {"reference": "r", "digest": "sha256:x"}}}`
	write := func(t *testing.T, dir, name, doc string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	volumes := func(s *Store) []string {
		var out []string
		for k := range s.Snapshot().Volumes {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	t.Run("volumes in state.json", func(t *testing.T) {
		dir := t.TempDir()
		write(t, dir, legacyState, legacy)
		s := open(t, dir)
		if got := volumes(s); !slices.Equal(got, []string{"/old"}) || s.Snapshot().Images["r|"].Digest != "sha256:x" {
			t.Fatalf("volumes %v, state %+v", got, s.Snapshot())
		}
	})
	t.Run("volumes.json took them over", func(t *testing.T) {
		dir := t.TempDir()
		write(t, dir, legacyState, legacy)
		// volumes.json names the sha256 of the state.json it took the volumes from.
		write(t, dir, legacyVolumes, `{"volumes": {"/new": {"volumeId": "n", "targetPath": "/new"}}, "migratedFrom": "`+digest.FromString(legacy).Encoded()+`"}`)
		if got := volumes(open(t, dir)); !slices.Equal(got, []string{"/new"}) {
			t.Fatalf("volumes %v, want volumes.json's", got)
		}
	})
	t.Run("state.json written by a downgraded driver", func(t *testing.T) {
		dir := t.TempDir()
		write(t, dir, legacyState, legacy)
		write(t, dir, legacyVolumes, `{"volumes": {"/new": {"volumeId": "n", "targetPath": "/new"}}, "migratedFrom": "0000"}`)
		if got := volumes(open(t, dir)); !slices.Equal(got, []string{"/old"}) {
			t.Fatalf("volumes %v, want the downgraded driver's state.json's", got)
		}
	})
	t.Run("access.json version 1", func(t *testing.T) {
		dir := t.TempDir()
		write(t, dir, legacyAccess, `{"version": 1, "records": {"`+llama+`": [{"kind": "anonymous", "via": "check"}]}}`)
		records, _, err := open(t, dir).Access()
		if err != nil || len(records) != 0 {
			t.Fatalf("records of version 1 imported: %s %v", records, err)
		}
	})
}

// A released document that does not parse, or is not ours (a link to a forged one elsewhere, a file others may
// write), is set aside and not believed; a lost state.json or volumes.json is reported (the driver then treats its
// state as lost), a lost access.json is not (each caller is checked once more). The rest is imported.
func TestUnbelievableDocumentsAreSetAside(t *testing.T) {
	forged := filepath.Join(t.TempDir(), "forged.json")
	os.WriteFile(forged, []byte(`{"volumes": {"/forged": {"volumeId": "forged"}}, "version": 2, "records": {"`+llama+`": [{"kind": "anonymous"}]}}`), 0o600)
	for _, doc := range []string{legacyState, legacyVolumes, legacyAccess} {
		for how, plant := range map[string]func(p string){
			"garbage":  func(p string) { os.WriteFile(p, []byte(`{"volumes": {`), 0o600) },
			"link":     func(p string) { os.Remove(p); os.Symlink(forged, p) },
			"writable": func(p string) { b, _ := os.ReadFile(forged); os.WriteFile(p, b, 0o600); os.Chmod(p, 0o666) },
		} {
			t.Run(doc+" "+how, func(t *testing.T) {
				dir := t.TempDir()
				released(t, dir)
				p := filepath.Join(dir, doc)
				plant(p)
				s, err := openAt(dir, boot, nil)
				if s == nil {
					t.Fatal(err)
				}
				defer s.Close()
				var ce *CorruptError
				if reported := errors.As(err, &ce) && ce.Path == p; reported != (doc != legacyAccess) {
					t.Fatalf("got %v", err)
				}
				st := s.Snapshot()
				records, _, _ := s.Access()
				switch {
				case st.Volumes["/forged"].VolumeID != "":
					t.Error("forged volumes believed")
				case doc == legacyState && (len(st.Images) != 0 || len(st.Volumes) != 2):
					t.Errorf("with state.json lost: %+v", st)
				case doc == legacyVolumes && (len(st.Volumes) != 0 || len(st.Images) != 1):
					t.Errorf("with volumes.json lost: %+v", st)
				case doc == legacyAccess && (len(records) != 0 || len(st.Volumes) != 2):
					t.Errorf("with access.json lost: %s %+v", records, st)
				}
				if _, err := os.Lstat(p + ".corrupt"); err != nil {
					t.Errorf("not set aside: %v", err)
				}
			})
		}
	}
	if b, _ := os.ReadFile(forged); !strings.Contains(string(b), "/forged") {
		t.Fatal("the forged document itself changed")
	}
}
