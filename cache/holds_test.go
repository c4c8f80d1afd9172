package cache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"

	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/testenv"
)

const holdHelperEnv = "MODELPACK_CACHE_HOLD_HELPER"

// fakeBoot makes the cache read the boot id from a file the test writes; boot changes it (a restart of the machine).
func fakeBoot(t *testing.T) (boot func(id string)) {
	p := filepath.Join(t.TempDir(), "boot_id")
	boot = func(id string) {
		if err := os.WriteFile(p, []byte(id+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	boot("boot-1")
	t.Cleanup(cas.FakeBootIDForTesting(p))
	return boot
}

func owners(t *testing.T, c *Cache) []string {
	t.Helper()
	refs, err := c.Refs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range refs {
		out = append(out, r.Owner)
	}
	return out
}

// A volatile owner's hold (a mount's) lasts as long as the boot: it survives a restart of the process and is gone
// after a restart of the machine, while a pin's stays. A volatile hold meta.db recorded before the holds file
// existed moves there at Open.
func TestVolatileHoldsLastTheBoot(t *testing.T) {
	boot := fakeBoot(t)
	src := newMemTarget()
	desc := src.manifestDesc(modelManifest(t, src, sampleModel(t, 1)))
	root := t.TempDir()
	opts := Options{Root: root, VolatileOwnerPrefix: "csi-"}

	legacy, err := Open(Options{Root: root}) // no volatile owners: csi-old is recorded in meta.db
	if err != nil {
		t.Fatal(err)
	}
	if _, err := legacy.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"csi-old", "pin:p"} {
		if _, err := legacy.Acquire(o, desc.Digest, Selector{}); err != nil {
			t.Fatal(err)
		}
	}
	legacy.Close()

	c, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire("csi-new", desc.Digest, Selector{}); err != nil {
		t.Fatal(err)
	}
	var inMeta []string
	c.db.View(func(tx *bolt.Tx) error {
		refs, err := allRefs(tx)
		for o := range refs {
			inMeta = append(inMeta, o)
		}
		return err
	})
	if !slices.Equal(inMeta, []string{"pin:p"}) {
		t.Errorf("meta.db holds %v, want only the pin", inMeta)
	}
	c.Close()

	c, err = Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := owners(t, c); !slices.Equal(got, []string{"csi-new", "csi-old", "pin:p"}) {
		t.Errorf("after a restart of the process: holds %v", got)
	}
	c.Close()

	boot("boot-2")
	c = openCache(t, root, opts)
	if got := owners(t, c); !slices.Equal(got, []string{"pin:p"}) {
		t.Errorf("after a restart of the machine: holds %v, want the pin's alone", got)
	}
	if files, _ := os.ReadDir(filepath.Join(root, "holds")); len(files) != 1 || files[0].Name() != "boot-2.db" {
		t.Errorf("holds/ after a restart of the machine: %v", files)
	}
	if u, err := c.Usage(); err != nil || u.Refs != 1 {
		t.Errorf("usage counts %d references (%v), want 1", u.Refs, err)
	}
}

// A volatile owner's Acquire, warm (its view built), and its Release commit nothing to meta.db, so they wait for no
// flush to disk; a pin's Acquire does (the control: a commit to meta.db is seen).
func TestVolatileAcquireDoesNotWriteMetadata(t *testing.T) {
	fakeBoot(t)
	src := newMemTarget()
	desc := src.manifestDesc(modelManifest(t, src, sampleModel(t, 2)))
	c := openCache(t, t.TempDir(), Options{VolatileOwnerPrefix: "csi-"})
	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire("csi-a", desc.Digest, Selector{}); err != nil { // builds the view
		t.Fatal(err)
	}
	txid := func() (id int) {
		c.db.View(func(tx *bolt.Tx) error { id = tx.ID(); return nil })
		return id
	}
	before := txid()
	for _, o := range []string{"csi-b", "csi-a", "csi-b"} {
		if _, err := c.Acquire(o, desc.Digest, Selector{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Release("csi-b"); err != nil {
		t.Fatal(err)
	}
	if after := txid(); after != before {
		t.Errorf("volatile Acquire and Release committed %d transactions to meta.db", after-before)
	}
	if got := owners(t, c); !slices.Equal(got, []string{"csi-a"}) {
		t.Errorf("holds %v, want csi-a", got)
	}
	entries, err := c.List()
	if err != nil || len(entries) != 1 || !slices.Equal(entries[0].Refs, []string{"csi-a"}) {
		t.Fatalf("list: %+v %v", entries, err)
	}
	used := entries[0].LastUsed
	if _, err := c.Acquire("pin:p", desc.Digest, Selector{}); err != nil {
		t.Fatal(err)
	}
	if txid() == before {
		t.Error("a pin's Acquire committed nothing to meta.db: the probe sees no commit")
	}
	// The last use a volatile Acquire recorded is what List and GC see, and GC makes it durable.
	if err := c.Release("pin:p"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire("csi-a", desc.Digest, Selector{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GC(context.Background()); err != nil {
		t.Fatal(err)
	}
	var st manifestState
	c.db.View(func(tx *bolt.Tx) error { st, _, _ = stateOf(tx, desc.Digest); return nil })
	if entries, _ := c.List(); !entries[0].LastUsed.After(used) || !st.LastUsed.Equal(entries[0].LastUsed) {
		t.Errorf("last use: listed %v (was %v), meta.db %v after GC", entries[0].LastUsed, used, st.LastUsed)
	}
}

// GC never evicts a manifest only a volatile owner holds, whichever way it interleaves with that owner's Acquire:
// run between Acquire's check of the blobs and its record, it evicts the manifest and the Acquire fails cleanly;
// run between the record and the view, it sees the hold and keeps the manifest.
func TestGCKeepsWhatVolatileOwnersHold(t *testing.T) {
	fakeBoot(t)
	ctx := context.Background()
	for _, step := range []string{"checked", "recorded"} {
		t.Run(step, func(t *testing.T) {
			src := newMemTarget()
			desc := src.manifestDesc(modelManifest(t, src, sampleModel(t, 3)))
			c := openCache(t, t.TempDir(), Options{MaxBytes: 1, MinAge: -1, VolatileOwnerPrefix: "csi-"})
			if _, err := c.Pull(ctx, src, desc, nil); err != nil {
				t.Fatal(err)
			}
			var evicted []digest.Digest
			set(t, &c.hooks.acquire, func(s string) {
				if s == step {
					st, err := c.GC(ctx)
					if err != nil {
						t.Error(err)
					}
					evicted = st.Evicted
				}
			})
			dir, err := c.Acquire("csi-a", desc.Digest, Selector{})
			c.hooks.acquire.Store(nil)
			switch step {
			case "checked":
				if !errors.Is(err, ErrNotFound) || len(evicted) != 1 {
					t.Fatalf("GC before the record: evicted %v, Acquire %v; want it evicted and ErrNotFound", evicted, err)
				}
				if got := owners(t, c); len(got) != 0 {
					t.Fatalf("a failed Acquire left holds %v", got)
				}
			case "recorded":
				if err != nil || len(evicted) != 0 {
					t.Fatalf("GC after the record: evicted %v, Acquire %v", evicted, err)
				}
				if _, err := os.ReadFile(filepath.Join(dir, "config.json")); err != nil {
					t.Fatalf("the held view: %v", err)
				}
				if err := c.Remove(desc.Digest); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "csi-a") {
					t.Fatalf("Remove of a held manifest: %v", err)
				}
				// Released, it goes: the GC above could evict.
				c.Release("csi-a")
				if st, err := c.GC(ctx); err != nil || len(st.Evicted) != 1 {
					t.Fatalf("GC after the release: %+v %v", st, err)
				}
			}
		})
	}
}

// holdHelper runs in a subprocess: it takes a volatile hold in the cache at HOLD_ROOT, prints "ok" and waits to be
// killed.
func holdHelper() int {
	c, err := Open(Options{Root: os.Getenv("HOLD_ROOT"), VolatileOwnerPrefix: "csi-"})
	if err == nil {
		_, err = c.Acquire("csi-killed", digest.Digest(os.Getenv("HOLD_DIGEST")), Selector{})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ok")
	select {}
}

// A volatile hold is committed without a flush to disk, yet survives the process being killed (SIGKILL) right
// after: the kernel has it.
func TestVolatileHoldSurvivesAKilledProcess(t *testing.T) {
	// The boot is the kernel's, in both processes.
	src := newMemTarget()
	desc := src.manifestDesc(modelManifest(t, src, sampleModel(t, 4)))
	root := t.TempDir()
	c, err := Open(Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	c.Close()

	if line, stderr := testenv.KillAfterFirstLine(t, holdHelperEnv+"=1", "HOLD_ROOT="+root, "HOLD_DIGEST="+desc.Digest.String()); line != "ok" {
		t.Fatalf("helper: %q %s", line, stderr)
	}
	c = openCache(t, root, Options{VolatileOwnerPrefix: "csi-"})
	if got := owners(t, c); !slices.Equal(got, []string{"csi-killed"}) {
		t.Fatalf("after the kill: holds %v, want csi-killed", got)
	}
}

// Junk where the holds live — a file instead of the directory, or a directory, a link and another boot's file in
// it — neither stops Open nor is read: it is removed, and the holds of this boot start empty.
func TestHoldsJunkIsRemoved(t *testing.T) {
	fakeBoot(t)
	opts := func(root string) Options { return Options{Root: root, VolatileOwnerPrefix: "csi-"} }

	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "holds"), []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	openCache(t, root, opts(root)).Close()

	root = t.TempDir()
	holds := filepath.Join(root, "holds")
	outside := filepath.Join(t.TempDir(), "kept")
	for _, p := range []string{filepath.Join(holds, "boot-1.db", "x"), filepath.Join(holds, "old", "y"), outside} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("junk"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Dir(outside), filepath.Join(holds, "link")); err != nil {
		t.Fatal(err)
	}
	c := openCache(t, root, opts(root))
	if got := owners(t, c); len(got) != 0 {
		t.Errorf("holds %v from junk", got)
	}
	c.Close()
	if files, _ := os.ReadDir(holds); len(files) != 1 || files[0].Name() != "boot-1.db" || !files[0].Type().IsRegular() {
		t.Errorf("holds/ after Open: %v, want boot-1.db alone", files)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("a file behind a link in holds/ was removed: %v", err)
	}
}
