package cache

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/artifact"
)

// A manifest with a file "a" and a layer "a/b" is refused before any layer is fetched, naming both layers; nothing
// of it becomes mountable.
func TestPullRefusesConflictingLayerPaths(t *testing.T) {
	src := newMemTarget()
	files := []modelFile{{Path: "a", Data: []byte("file a")}, {Path: "a/b", Data: []byte("file a/b")}}
	desc := src.manifestDesc(modelManifest(t, src, files))
	c := openCache(t, t.TempDir(), Options{})
	_, err := c.Pull(context.Background(), src, desc, nil)
	if !errors.Is(err, artifact.ErrPathConflict) || !errors.Is(err, ErrUnsupported) {
		t.Fatalf("got %v, want ErrPathConflict as ErrUnsupported", err)
	}
	for _, f := range files {
		if d := pushBlob(t, src, "x", f.Data, nil).Digest; !strings.Contains(err.Error(), d.String()) {
			t.Errorf("%q does not name the layer of %s (%s)", err, f.Path, d)
		}
	}
	if c.Has(desc.Digest) {
		t.Fatal("the conflicting manifest is in the cache")
	}
}
