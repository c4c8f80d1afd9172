package ocitar

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/oci"

	"github.com/modelpack/modelpack/artifact"
)

// ErrHostile: the tar is not a plain OCI image layout (an entry outside it, a link, a name twice, a blob whose
// content is not its name, a manifest naming a blob it lacks). Nothing was copied out of it.
var ErrHostile = errors.New("refused OCI layout tar")

// Entry is one manifest index.json lists.
type Entry struct {
	ocispec.Descriptor
	// Tag is its org.opencontainers.image.ref.name, if any.
	Tag string
	// Name is its io.containerd.image.name (a full reference), if any.
	Name string
}

// Archive is a checked OCI layout tar, read in place (oras-go's read-only OCI store over the tar).
type Archive struct {
	Store   *oci.ReadOnlyStore
	Entries []Entry
}

// Open checks the tar at p (see ErrHostile) and opens it. It reads the whole tar once to hash every blob.
func Open(ctx context.Context, p string) (*Archive, error) {
	sizes, err := check(p)
	if err != nil {
		return nil, err
	}
	store, err := oci.NewFromTar(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	a := &Archive{Store: store}
	idx, err := readIndex(p)
	if err != nil {
		return nil, err
	}
	for _, d := range idx.Manifests {
		e := Entry{Descriptor: d, Tag: d.Annotations[ocispec.AnnotationRefName], Name: d.Annotations[AnnotationImageName]}
		e.Descriptor.Annotations = nil
		if err := complete(ctx, store, sizes, e.Descriptor, 0); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrHostile, p, err)
		}
		a.Entries = append(a.Entries, e)
	}
	return a, nil
}

// complete checks that every blob under node is in the tar.
func complete(ctx context.Context, store *oci.ReadOnlyStore, sizes map[digest.Digest]int64, node ocispec.Descriptor, depth int) error {
	if depth > 4 {
		return fmt.Errorf("manifest %s: indexes nested deeper than 4", node.Digest)
	}
	size, ok := sizes[node.Digest]
	if !ok {
		return fmt.Errorf("blob %s (%s) is named but not in the tar", node.Digest, node.MediaType)
	}
	if size != node.Size {
		return fmt.Errorf("blob %s is %d bytes in the tar, its descriptor says %d", node.Digest, size, node.Size)
	}
	if !artifact.IsManifest(node.MediaType) && !artifact.IsIndex(node.MediaType) {
		return nil
	}
	if err := artifact.CheckSize("manifest", node); err != nil {
		return err
	}
	succ, err := content.Successors(ctx, store, node)
	if err != nil {
		return fmt.Errorf("manifest %s: %w", node.Digest, err)
	}
	subject, err := subjectOf(ctx, store, node)
	if err != nil {
		return fmt.Errorf("manifest %s: %w", node.Digest, err)
	}
	for _, s := range succ {
		if subject != nil && subject.Digest == s.Digest {
			continue // a referrer's subject is another artifact: it need not be in the tar
		}
		if err := complete(ctx, store, sizes, s, depth+1); err != nil {
			return fmt.Errorf("manifest %s: %w", node.Digest, err)
		}
	}
	return nil
}

func subjectOf(ctx context.Context, store *oci.ReadOnlyStore, node ocispec.Descriptor) (*ocispec.Descriptor, error) {
	b, err := content.FetchAll(ctx, store, node)
	if err != nil {
		return nil, err
	}
	var m struct {
		Subject *ocispec.Descriptor `json:"subject"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return m.Subject, nil
}

// check reads the tar once: every entry is oci-layout, index.json, a blobs/ directory or blobs/<alg>/<encoded>, a
// regular file or directory, named once, and every blob hashes to its name.
func check(p string) (map[digest.Digest]int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	seen := map[string]bool{}
	sizes := map[digest.Digest]int64{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		refuse := func(why string) error { return fmt.Errorf("%w: %s: entry %q %s", ErrHostile, p, h.Name, why) }
		name := strings.TrimPrefix(h.Name, "./")
		if strings.HasPrefix(name, "/") || strings.Contains(name, "\\") {
			return nil, refuse("is not a path inside the layout")
		}
		clean := path.Clean(name)
		for _, part := range strings.Split(name, "/") {
			if part == ".." {
				return nil, refuse("leaves the layout (..)")
			}
		}
		if seen[clean] {
			return nil, refuse("is in the tar twice (which one a reader takes differs)")
		}
		seen[clean] = true
		switch h.Typeflag {
		case tar.TypeDir:
			if clean != "." && clean != "blobs" && !(path.Dir(clean) == "blobs" && !strings.Contains(path.Base(clean), ".")) {
				return nil, refuse("is a directory an OCI layout does not have")
			}
			continue
		case tar.TypeReg:
		default:
			return nil, refuse(fmt.Sprintf("is of type %q: an OCI layout holds regular files only (no links, devices or fifos)", h.Typeflag))
		}
		switch {
		case clean == ocispec.ImageLayoutFile, clean == ocispec.ImageIndexFile:
			if h.Size > artifact.MaxManifestBytes {
				return nil, refuse(fmt.Sprintf("is %d bytes, over the %d a layout document may have", h.Size, artifact.MaxManifestBytes))
			}
			continue
		case strings.HasPrefix(clean, "blobs/"):
		default:
			return nil, refuse("is not part of an OCI image layout (oci-layout, index.json, blobs/<algorithm>/<digest>)")
		}
		parts := strings.Split(clean, "/")
		if len(parts) != 3 {
			return nil, refuse("is not blobs/<algorithm>/<digest>")
		}
		d := digest.NewDigestFromEncoded(digest.Algorithm(parts[1]), parts[2])
		if err := d.Validate(); err != nil {
			return nil, refuse(fmt.Sprintf("does not name a digest: %v", err))
		}
		v := d.Verifier()
		if _, err := io.Copy(v, tr); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", p, h.Name, err)
		}
		if !v.Verified() {
			return nil, refuse("does not hold the content its name says (digest mismatch)")
		}
		sizes[d] = h.Size
	}
	if !seen[ocispec.ImageIndexFile] || !seen[ocispec.ImageLayoutFile] {
		return nil, fmt.Errorf("%w: %s: no %s and %s: not an OCI image layout tar", ErrHostile, p, ocispec.ImageLayoutFile, ocispec.ImageIndexFile)
	}
	return sizes, nil
}

// readIndex reads index.json out of the tar (checked to be there and small by check).
func readIndex(p string) (*ocispec.Index, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if path.Clean(strings.TrimPrefix(h.Name, "./")) != ocispec.ImageIndexFile {
			continue
		}
		var idx ocispec.Index
		if err := json.NewDecoder(io.LimitReader(tr, artifact.MaxManifestBytes)).Decode(&idx); err != nil {
			return nil, fmt.Errorf("%s: index.json: %w", p, err)
		}
		return &idx, nil
	}
}
