// Package ocitar is the air-gapped form of an artifact: an OCI image layout (oci-layout, index.json,
// blobs/<alg>/<hex>) in one tar file, what `modelpack save` writes and `load` reads, and what oras (--oci-layout),
// crane and skopeo read once it is extracted.
//
// Writer is an oras.Target that streams each blob into the tar as oras-go copies it (no staging copy of the model),
// verifying it against its digest. Open reads a tar from an untrusted source: every entry must be one of the
// layout's files (no path leaving it, no link, no device, no name twice), every blob's content must match its name,
// and every blob the manifests name must be there, all checked before the caller copies anything out of it.
package ocitar

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"

	"github.com/modelpack/modelpack/artifact"
)

// AnnotationImageName is containerd's index.json annotation holding an entry's full reference
// (registry/repository:tag), beside org.opencontainers.image.ref.name's tag; ctr import and load read it.
const AnnotationImageName = "io.containerd.image.name"

// epoch is every entry's modification time: the tar carries no time of the machine that wrote it.
var epoch = time.Unix(0, 0).UTC()

// Writer writes an OCI image layout as a tar stream. Blobs are written as they are pushed, one at a time; Close
// writes index.json. A failed Push leaves the tar unusable: the caller discards it.
type Writer struct {
	mu        sync.Mutex
	tw        *tar.Writer
	have      map[digest.Digest]bool
	dirs      map[string]bool
	manifests []ocispec.Descriptor // in push order, untagged ones (referrers) included
	tags      map[string]ocispec.Descriptor
	names     map[digest.Digest]string // manifest → full reference, for AnnotationImageName
	err       error
}

// NewWriter starts a layout in w.
func NewWriter(w io.Writer) (*Writer, error) {
	tw := &Writer{tw: tar.NewWriter(w), have: map[digest.Digest]bool{}, dirs: map[string]bool{},
		tags: map[string]ocispec.Descriptor{}, names: map[digest.Digest]string{}}
	b, _ := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err := tw.file(ocispec.ImageLayoutFile, b); err != nil {
		return nil, err
	}
	return tw, nil
}

func (w *Writer) file(name string, b []byte) error {
	if err := w.tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err := w.tw.Write(b)
	return err
}

func (w *Writer) dir(name string) error {
	if w.dirs[name] {
		return nil
	}
	w.dirs[name] = true
	return w.tw.WriteHeader(&tar.Header{Name: name + "/", Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir, Format: tar.FormatPAX})
}

// Push writes a blob (a manifest too) under blobs/<alg>/<hex>, checking it against expected as it goes.
func (w *Writer) Push(_ context.Context, expected ocispec.Descriptor, r io.Reader) error {
	if err := expected.Digest.Validate(); err != nil {
		return fmt.Errorf("blob %q: %w", expected.Digest, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if w.have[expected.Digest] {
		return fmt.Errorf("%s: %w", expected.Digest, errdef.ErrAlreadyExists)
	}
	alg := expected.Digest.Algorithm().String()
	if err := w.dir("blobs"); err != nil {
		return w.fail(err)
	}
	if err := w.dir("blobs/" + alg); err != nil {
		return w.fail(err)
	}
	if err := w.tw.WriteHeader(&tar.Header{Name: blobPath(expected.Digest), Mode: 0o644, Size: expected.Size, ModTime: epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
		return w.fail(err)
	}
	vr := content.NewVerifyReader(r, expected)
	if _, err := io.Copy(w.tw, vr); err != nil {
		return w.fail(fmt.Errorf("blob %s: %w", expected.Digest, err))
	}
	if err := vr.Verify(); err != nil {
		return w.fail(fmt.Errorf("blob %s: %w", expected.Digest, err))
	}
	w.have[expected.Digest] = true
	if artifact.IsManifest(expected.MediaType) || artifact.IsIndex(expected.MediaType) {
		m := expected
		m.Annotations = nil // index.json's annotations are its own (the tags)
		w.manifests = append(w.manifests, m)
	}
	return nil
}

// fail poisons the writer: a tar entry cut short cannot be followed by another.
func (w *Writer) fail(err error) error {
	w.err = err
	return err
}

// Exists reports whether the blob was written.
func (w *Writer) Exists(_ context.Context, target ocispec.Descriptor) (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.have[target.Digest], nil
}

// Fetch is not offered: the tar is written, not read back (oras-go's copy never asks its destination).
func (w *Writer) Fetch(context.Context, ocispec.Descriptor) (io.ReadCloser, error) {
	return nil, fmt.Errorf("reading back a tar being written: %w", errdef.ErrUnsupported)
}

// Tag names a written manifest in index.json (org.opencontainers.image.ref.name).
func (w *Writer) Tag(_ context.Context, desc ocispec.Descriptor, reference string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.have[desc.Digest] {
		return fmt.Errorf("tag %s: %s: %w", reference, desc.Digest, errdef.ErrNotFound)
	}
	w.tags[reference] = desc
	return nil
}

// Resolve resolves a tag given to Tag.
func (w *Writer) Resolve(_ context.Context, reference string) (ocispec.Descriptor, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	d, ok := w.tags[reference]
	if !ok {
		return ocispec.Descriptor{}, fmt.Errorf("%s: %w", reference, errdef.ErrNotFound)
	}
	return d, nil
}

// Name records the full reference of a manifest (io.containerd.image.name on its index.json entry), so load can
// give the artifact its name back; a manifest saved by digest has a name and no tag.
func (w *Writer) Name(d digest.Digest, full string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.names[d] = full
}

// Close writes index.json — the tagged manifests first, by tag, then every other manifest written (referrers),
// untagged — and ends the tar. It does not close the underlying writer.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	idx := ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{}}
	tagged := map[digest.Digest]bool{}
	for _, tag := range slices.Sorted(maps.Keys(w.tags)) {
		d := w.tags[tag]
		d.Annotations = map[string]string{ocispec.AnnotationRefName: tag}
		if full := w.names[d.Digest]; full != "" && !cosignTag.MatchString(tag) {
			d.Annotations[AnnotationImageName] = full
		}
		idx.Manifests = append(idx.Manifests, d)
		tagged[d.Digest] = true
	}
	for _, d := range w.manifests {
		if !tagged[d.Digest] {
			if full := w.names[d.Digest]; full != "" {
				d.Annotations = map[string]string{AnnotationImageName: full}
			}
			idx.Manifests = append(idx.Manifests, d)
		}
	}
	b, err := json.Marshal(idx)
	if err != nil {
		return err
	}
	if err := w.file(ocispec.ImageIndexFile, b); err != nil {
		return err
	}
	return w.tw.Close()
}

func blobPath(d digest.Digest) string {
	return "blobs/" + d.Algorithm().String() + "/" + d.Encoded()
}
