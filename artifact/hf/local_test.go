package hf

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/artifact/pack"
)

// TestLocalSnapshotRefusesLinksOutOfTheCache: a snapshot file is a link into its repository's blobs/, named by
// the content's sha256 (LFS) or git blob id. A link anywhere else — a planted ~/.ssh/id_rsa, a blob of another
// repository — would pack that file into the artifact; it is refused, naming the link and its target, and a
// snapshot of proper links packs.
func TestLocalSnapshotRefusesLinksOutOfTheCache(t *testing.T) {
	cache := t.TempDir()
	const commit = "0123456789abcdef0123456789abcdef01234567"
	ref, err := ParseReference("hf://org/model@" + commit)
	if err != nil {
		t.Fatal(err)
	}
	repo := filepath.Join(cache, "models--org--model")
	snap := filepath.Join(repo, "snapshots", commit)
	weights := []byte("weights")
	sum := sha256.Sum256(weights)
	blob := filepath.Join(repo, "blobs", hex.EncodeToString(sum[:]))
	for _, d := range []string{snap, filepath.Dir(blob)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(blob, weights, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..", "..", "blobs", filepath.Base(blob)), filepath.Join(snap, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	s, err := LocalSnapshot(cache, ref, Options{TempDir: t.TempDir()})
	if err != nil {
		t.Fatalf("a snapshot of proper links: %v", err)
	}
	s.Close()

	secret := filepath.Join(t.TempDir(), "id_rsa")
	if err := os.WriteFile(secret, []byte("-----BEGIN OPENSSH PRIVATE KEY-----"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(cache, "models--else--where", "blobs", strings.Repeat("a", 64))
	os.MkdirAll(filepath.Dir(other), 0o755)
	os.WriteFile(other, []byte("another repository's blob"), 0o644)
	misnamed := filepath.Join(repo, "blobs", "notes.txt")
	os.WriteFile(misnamed, []byte("not a blob name"), 0o644)
	for name, target := range map[string]string{"secret": secret, "another repository": other, "misnamed": misnamed} {
		link := filepath.Join(snap, "config.json")
		os.Remove(link)
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		_, err := LocalSnapshot(cache, ref, Options{TempDir: t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), "config.json links to "+target) || !strings.Contains(err.Error(), "not a blob of the local Hub cache") {
			t.Errorf("%s: a link to %s gave %v", name, target, err)
		}
	}
}

// TestDatasetRulesYieldToTheUsersInTheirSyntax: a user's --kind rule is in --include's syntax (a name without "/"
// matches at any depth), so a dataset file it names is the user's, however deep it lies, and a Modelfile rule's
// path.Match names only the whole path.
func TestDatasetRulesYieldToTheUsersInTheirSyntax(t *testing.T) {
	for _, c := range []struct {
		rule pack.Rule
		path string
		want bool
	}{
		{pack.Rule{Pattern: "*.csv", Glob: true}, "data/train.csv", true},
		{pack.Rule{Pattern: "data", Glob: true}, "data/train.csv", true},
		{pack.Rule{Pattern: "*.csv"}, "data/train.csv", false},
		{pack.Rule{Pattern: "data/*.csv"}, "data/train.csv", true},
		{pack.Rule{Pattern: "*.json", Glob: true}, "data/train.csv", false},
	} {
		if got := matchedBy([]pack.Rule{c.rule}, c.path); got != c.want {
			t.Errorf("rule %+v on %s: %v, want %v", c.rule, c.path, got, c.want)
		}
	}
}
