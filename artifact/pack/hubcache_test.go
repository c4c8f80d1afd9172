package pack_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/pack"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// hubCache lays a model out as the Hub's clients cache it: CACHE/models--acme--tiny/{blobs/<etag>,
// snapshots/<commit>/<path> → ../../blobs/<etag>, refs/main}, and returns the repository's cache dir and the commit.
func hubCache(t *testing.T) (repoDir, commit string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	if err := testmodel.Generate(src, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	os.WriteFile(filepath.Join(src, "sub", "notes.md"), []byte("nested\n"), 0o644)
	repoDir = filepath.Join(t.TempDir(), "hub", "models--acme--tiny")
	commit = strings.Repeat("ab", 20)
	snap := filepath.Join(repoDir, "snapshots", commit)
	blobs := filepath.Join(repoDir, "blobs")
	os.MkdirAll(blobs, 0o755)
	os.MkdirAll(filepath.Join(repoDir, "refs"), 0o755)
	os.WriteFile(filepath.Join(repoDir, "refs", "main"), []byte(commit), 0o644)
	i := 0
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		etag := strings.Repeat("0", 30) + string(rune('a'+i))
		i++
		if err := os.Rename(p, filepath.Join(blobs, etag)); err != nil {
			return err
		}
		link := filepath.Join(snap, rel)
		os.MkdirAll(filepath.Dir(link), 0o755)
		target, _ := filepath.Rel(filepath.Dir(link), filepath.Join(blobs, etag))
		return os.Symlink(target, link)
	})
	if err != nil {
		t.Fatal(err)
	}
	return repoDir, commit
}

// A snapshot of a Hub cache packs: its symlinks into the cache's blobs/ are followed, and the files keep their
// snapshot paths.
func TestPackHubCacheSnapshot(t *testing.T) {
	repoDir, commit := hubCache(t)
	s := openStore(t)
	m, cfg := readManifest(t, s, packInto(t, s, filepath.Join(repoDir, "snapshots", commit), pack.Options{}))
	if !strings.Contains(string(cfg), `"revision":"`+commit+`"`) {
		t.Errorf("the config does not record the snapshot's commit: %s", cfg)
	}
	var paths []string
	for _, l := range m.Layers {
		paths = append(paths, l.Annotations[artifact.AnnotationFilepath])
	}
	got := strings.Join(paths, " ")
	for _, want := range []string{testmodel.ShardName(0, 2), "config.json", "sub/notes.md"} {
		if !strings.Contains(got, want) {
			t.Errorf("layers %s lack %s", got, want)
		}
	}
	if strings.Contains(got, "blobs") {
		t.Errorf("layers name the cache's blobs: %s", got)
	}
}

// Only the snapshot's own cache's blobs/ are reachable: a link elsewhere — another repository's blobs, a file
// beside the cache — is refused as in any model directory, and a cache root is refused naming what to pack.
func TestPackHubCacheRefusals(t *testing.T) {
	repoDir, commit := hubCache(t)
	snap := filepath.Join(repoDir, "snapshots", commit)
	other := filepath.Join(filepath.Dir(repoDir), "models--acme--other", "blobs")
	os.MkdirAll(other, 0o755)
	os.WriteFile(filepath.Join(other, "x"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(filepath.Dir(repoDir), "secret"), []byte("s"), 0o644)

	for name, target := range map[string]string{
		"other repository's blob": filepath.Join(other, "x"),
		"file beside the cache":   filepath.Join(filepath.Dir(repoDir), "secret"),
		"the cache's refs":        filepath.Join(repoDir, "refs", "main"),
	} {
		t.Run(name, func(t *testing.T) {
			link := filepath.Join(snap, "extra.json")
			os.Remove(link)
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			defer os.Remove(link)
			_, err := pack.Pack(context.Background(), snap, pack.Options{Tag: "a:b"}, openStore(t).Sink())
			if err == nil || !strings.Contains(err.Error(), "extra.json: symlink points outside the model directory") {
				t.Fatalf("err = %v", err)
			}
		})
	}

	_, err := pack.Pack(context.Background(), repoDir, pack.Options{Tag: "a:b"}, openStore(t).Sink())
	want := "a Hugging Face Hub cache of acme/tiny, not a model directory: pack one snapshot (modelpack pack " + snap + " -t NAME:TAG), or the Hub's copy (modelpack pack hf://acme/tiny -t NAME:TAG)"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("packing the cache root: %v\nwant %s", err, want)
	}
}
