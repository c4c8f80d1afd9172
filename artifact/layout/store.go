// Package layout is modelpack's local store: an OCI image layout directory (oci-layout, index.json, blobs/sha256)
// on top of the verified blob directory of package cas, so that oras --oci-layout and other OCI tools read it as
// they read any layout.
//
// Tags are index.json entries annotated with org.opencontainers.image.ref.name, holding full references
// ("llama3:8b", "registry.local/org/model:v1"). index.json is replaced atomically (temp file, fsync, rename) under
// a file lock, so concurrent modelpack processes never lose each other's tags. Store implements oras-go's
// content.Storage, content.TagResolver, content.Deleter, registry.TagLister and content.PredecessorFinder, so
// oras.Copy and oras.ExtendedCopy (with signatures and other referrers) move artifacts between it and a registry.
// Referrers pushed without a tag are recorded in index.json without a name and live as long as their subject.
//
// Blobs are written before the tags that reach them, so a crash leaves at most unreferenced blobs, which Prune
// removes. Prune must not remove blobs of a pack still in progress: every Store that writes holds a shared lock on
// the layout until Close, and Prune takes it exclusively.
package layout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/flock"
	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/diskio"
)

// Interfaces the store implements, checked at compile time.
var (
	_ content.Storage     = (*Store)(nil)
	_ content.TagResolver = (*Store)(nil)
	_ content.Untagger    = (*Store)(nil)
	_ content.Deleter     = (*Store)(nil)
	_ registry.TagLister  = (*Store)(nil)
	// With Predecessors, oras.ExtendedCopy (push --referrers) finds the signatures and SBOMs of a stored artifact.
	_ content.ReadOnlyGraphStorage = (*Store)(nil)
)

const (
	indexFile     = "index.json"
	layoutFile    = "oci-layout"
	indexLockFile = "index.json.lock"
	gcLockFile    = "gc.lock"
	lockRetry     = 20 * time.Millisecond
)

// Store is an OCI image layout directory.
type Store struct {
	root  string
	blobs *cas.Store

	mu        sync.Mutex   // serialises index.json updates within the process
	indexLock *flock.Flock // serialises them across processes

	gcMu     sync.Mutex
	gc       *flock.Flock // shared while this Store may write blobs, exclusive while pruning
	gcShared bool
}

// Entry is a tagged artifact.
type Entry struct {
	Reference  string             `json:"reference"`
	Descriptor ocispec.Descriptor `json:"descriptor"`
}

// Open opens the layout at root, creating it if needed.
func Open(root string) (*Store, error) {
	blobs, err := cas.Open(root)
	if err != nil {
		return nil, err
	}
	s := &Store{
		root:      blobs.Root(),
		blobs:     blobs,
		indexLock: flock.New(filepath.Join(blobs.Root(), indexLockFile)),
		gc:        flock.New(filepath.Join(blobs.Root(), gcLockFile)),
	}
	if _, err := os.Stat(filepath.Join(s.root, layoutFile)); errors.Is(err, os.ErrNotExist) {
		b, _ := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
		if err := diskio.WriteFileAtomic(filepath.Join(s.root, layoutFile), b, 0o644); err != nil {
			return nil, fmt.Errorf("create %s: %w", layoutFile, err)
		}
	}
	if _, err := os.Stat(filepath.Join(s.root, indexFile)); errors.Is(err, os.ErrNotExist) {
		if err := s.updateIndex(func(*ocispec.Index) error { return nil }); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Root is the layout directory.
func (s *Store) Root() string { return s.root }

// Blobs is the blob directory under the layout, for writers that need cas directly (resumable ingests). It takes
// the store's writer lock, so Prune in another process waits until Close.
func (s *Store) Blobs() (*cas.Store, error) {
	if err := s.holdWriterLock(context.Background()); err != nil {
		return nil, err
	}
	return s.blobs, nil
}

// Close releases the writer lock.
func (s *Store) Close() error {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	s.gcShared = false
	return s.gc.Unlock()
}

// holdWriterLock takes the shared layout lock that keeps Prune from deleting blobs this Store has written but not
// yet tagged. It is kept until Close.
func (s *Store) holdWriterLock(ctx context.Context) error {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	if s.gcShared {
		return nil
	}
	if _, err := s.gc.TryRLockContext(ctx, lockRetry); err != nil {
		return fmt.Errorf("lock store %s: %w", s.root, err)
	}
	s.gcShared = true
	return nil
}

// Fetch opens a blob. A blob whose file changed since its bytes were verified (its stamp, see cas) is re-hashed
// first; wrong, it is quarantined and the error says to pull it again.
func (s *Store) Fetch(ctx context.Context, target ocispec.Descriptor) (io.ReadCloser, error) {
	if _, err := s.blobs.Check(target.Digest); errors.Is(err, cas.ErrDigestMismatch) {
		qerr := s.blobs.Quarantine(target.Digest)
		return nil, errors.Join(fmt.Errorf("blob %s of the local store was changed on disk and is quarantined; pull the artifact again: %w", target.Digest, err), qerr)
	}
	f, err := s.blobs.Open(target.Digest)
	if err != nil {
		return nil, notFound(err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if fi.Size() != target.Size {
		f.Close()
		return nil, fmt.Errorf("blob %s: %w: stored %d bytes, descriptor says %d", target.Digest, cas.ErrSizeMismatch, fi.Size(), target.Size)
	}
	return f, nil
}

// Exists reports whether the blob of target's digest and size is stored.
func (s *Store) Exists(ctx context.Context, target ocispec.Descriptor) (bool, error) {
	return s.blobs.Exists(target.Digest, target.Size)
}

// Push stores content after checking it against expected's size and digest. A manifest that refers to a subject
// (a signature, an SBOM) is also recorded, untagged, in index.json so that it lives as long as its subject.
func (s *Store) Push(ctx context.Context, expected ocispec.Descriptor, r io.Reader) error {
	if err := s.holdWriterLock(ctx); err != nil {
		return err
	}
	opened := false
	err := s.blobs.Ingest(ctx, expected.Digest, expected.Size, func(ctx context.Context, offset int64) (io.ReadCloser, int64, error) {
		if opened {
			return nil, 0, errors.New("push: content reader cannot be read twice")
		}
		opened = true
		return io.NopCloser(r), 0, nil
	})
	if err != nil {
		return err
	}
	if !isManifest(expected.MediaType) {
		return nil
	}
	m, err := s.readManifest(expected)
	if err != nil {
		return err
	}
	if m.Subject == nil {
		return nil
	}
	return s.updateIndex(func(idx *ocispec.Index) error {
		for _, d := range idx.Manifests {
			if d.Digest == expected.Digest && d.Annotations[ocispec.AnnotationRefName] == "" {
				return nil
			}
		}
		idx.Manifests = append(idx.Manifests, plain(expected))
		return nil
	})
}

// Delete removes a blob and every index.json entry that points at it.
func (s *Store) Delete(ctx context.Context, target ocispec.Descriptor) error {
	if ok, err := s.blobs.Exists(target.Digest, target.Size); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("%s: %w", target.Digest, errdef.ErrNotFound)
	}
	if err := s.updateIndex(func(idx *ocispec.Index) error {
		keep := idx.Manifests[:0]
		for _, d := range idx.Manifests {
			if d.Digest != target.Digest {
				keep = append(keep, d)
			}
		}
		idx.Manifests = keep
		return nil
	}); err != nil {
		return err
	}
	return s.blobs.Delete(target.Digest)
}

// Tag points reference at desc, replacing what it pointed at before. desc must be stored. A bare digest reference
// only checks that.
func (s *Store) Tag(ctx context.Context, desc ocispec.Descriptor, reference string) error {
	if err := s.holdWriterLock(ctx); err != nil {
		return err
	}
	if ok, err := s.blobs.Exists(desc.Digest, desc.Size); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("tag %s: %s: %w", reference, desc.Digest, errdef.ErrNotFound)
	}
	if d, err := digest.Parse(reference); err == nil {
		if d != desc.Digest {
			return fmt.Errorf("%w: %s does not name %s", errdef.ErrInvalidReference, reference, desc.Digest)
		}
		return nil
	}
	ref, err := ParseReference(reference)
	if err != nil {
		return err
	}
	if _, d, ok := strings.Cut(ref, "@"); ok && d != desc.Digest.String() {
		return fmt.Errorf("%w: %s does not name %s", errdef.ErrInvalidReference, ref, desc.Digest)
	}
	entry := plain(desc)
	entry.Annotations = map[string]string{ocispec.AnnotationRefName: ref}
	return s.updateIndex(func(idx *ocispec.Index) error {
		keep := idx.Manifests[:0]
		for _, d := range idx.Manifests {
			if d.Annotations[ocispec.AnnotationRefName] != ref {
				keep = append(keep, d)
			}
		}
		idx.Manifests = append(keep, entry)
		return nil
	})
}

// Resolve finds what a reference points at: a tag ("llama3:8b", canonicalised as by ParseReference), a digest
// ("sha256:…") or a name with a digest, both of which resolve to a stored manifest.
func (s *Store) Resolve(ctx context.Context, reference string) (ocispec.Descriptor, error) {
	if reference == "" {
		return ocispec.Descriptor{}, errdef.ErrMissingReference
	}
	idx, err := s.readIndex()
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	// A layout written by another tool may name entries with bare tags ("v1"): an exact match comes first.
	for _, d := range idx.Manifests {
		if d.Annotations[ocispec.AnnotationRefName] == reference {
			return plain(d), nil
		}
	}
	dgst, err := digest.Parse(reference)
	if err != nil {
		ref, perr := ParseReference(reference)
		if perr != nil {
			return ocispec.Descriptor{}, perr
		}
		for _, d := range idx.Manifests {
			if d.Annotations[ocispec.AnnotationRefName] == ref {
				return plain(d), nil
			}
		}
		_, ds, ok := strings.Cut(ref, "@")
		if !ok {
			return ocispec.Descriptor{}, fmt.Errorf("%s: %w", ref, errdef.ErrNotFound)
		}
		dgst = digest.Digest(ds)
	}
	for _, d := range idx.Manifests {
		if d.Digest == dgst {
			return plain(d), nil
		}
	}
	// A stored manifest no entry names: describe it from its own bytes.
	size, err := s.blobs.Stat(dgst)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("%s: %w", reference, errdef.ErrNotFound)
	}
	desc := ocispec.Descriptor{Digest: dgst, Size: size}
	m, err := s.readManifest(desc)
	if err != nil || !isManifest(m.MediaType) {
		return ocispec.Descriptor{}, fmt.Errorf("%s: %w (not a manifest)", reference, errdef.ErrNotFound)
	}
	desc.MediaType, desc.ArtifactType = m.MediaType, m.ArtifactType
	return desc, nil
}

// Untag removes a tag: an entry named exactly reference (as in layouts other tools wrote), else its canonical
// form. The content stays until Prune.
func (s *Store) Untag(ctx context.Context, reference string) error {
	ref, err := ParseReference(reference)
	if err != nil && !s.hasEntry(reference) {
		return err
	}
	return s.updateIndex(func(idx *ocispec.Index) error {
		name := ref
		for _, d := range idx.Manifests {
			if d.Annotations[ocispec.AnnotationRefName] == reference {
				name = reference
			}
		}
		keep := idx.Manifests[:0]
		found := false
		for _, d := range idx.Manifests {
			if d.Annotations[ocispec.AnnotationRefName] == name {
				found = true
				continue
			}
			keep = append(keep, d)
		}
		if !found {
			return fmt.Errorf("%s: %w", name, errdef.ErrNotFound)
		}
		idx.Manifests = keep
		return nil
	})
}

// Predecessors lists the manifests recorded in index.json that point at node: referrers whose subject it is, and
// indexes that list it. Layers and configs are not indexed back to their manifests.
func (s *Store) Predecessors(ctx context.Context, node ocispec.Descriptor) ([]ocispec.Descriptor, error) {
	idx, err := s.readIndex()
	if err != nil {
		return nil, err
	}
	seen := map[digest.Digest]bool{}
	var out []ocispec.Descriptor
	for _, d := range idx.Manifests {
		if seen[d.Digest] || d.Digest == node.Digest {
			continue
		}
		seen[d.Digest] = true
		m, err := s.readManifest(d)
		if err != nil {
			if errors.Is(err, errdef.ErrNotFound) {
				continue
			}
			return nil, err
		}
		points := m.Subject != nil && m.Subject.Digest == node.Digest
		for _, c := range m.Manifests {
			points = points || c.Digest == node.Digest
		}
		if points {
			out = append(out, plain(d))
		}
	}
	return out, nil
}

// Name is the entry name reference denotes: itself when an entry is named so exactly (a bare tag "8b" that oras
// --oci-layout wrote), else its canonical form (ParseReference: "llama3" is "llama3:latest").
func (s *Store) Name(reference string) (string, error) {
	if s.hasEntry(reference) {
		return reference, nil
	}
	return ParseReference(reference)
}

func (s *Store) hasEntry(reference string) bool {
	idx, err := s.readIndex()
	if err != nil {
		return false
	}
	for _, d := range idx.Manifests {
		if d.Annotations[ocispec.AnnotationRefName] == reference {
			return true
		}
	}
	return false
}

// Tags lists the references in lexical order after last (registry.TagLister).
func (s *Store) Tags(ctx context.Context, last string, fn func(tags []string) error) error {
	entries, err := s.List()
	if err != nil {
		return err
	}
	var tags []string
	for _, e := range entries {
		if e.Reference > last {
			tags = append(tags, e.Reference)
		}
	}
	if len(tags) == 0 {
		return nil
	}
	return fn(tags)
}

// List returns the tagged artifacts, ordered by reference.
func (s *Store) List() ([]Entry, error) {
	idx, err := s.readIndex()
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, d := range idx.Manifests {
		if ref := d.Annotations[ocispec.AnnotationRefName]; ref != "" {
			out = append(out, Entry{Reference: ref, Descriptor: plain(d)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Reference < out[j].Reference })
	return out, nil
}

// Manifest resolves reference and decodes the image manifest it names. An index (a multi-platform image) is an
// error: pick a platform's manifest by digest.
func (s *Store) Manifest(ctx context.Context, reference string) (ocispec.Descriptor, ocispec.Manifest, error) {
	desc, err := s.Resolve(ctx, reference)
	if err != nil {
		return desc, ocispec.Manifest{}, err
	}
	if !artifact.IsManifest(desc.MediaType) {
		return desc, ocispec.Manifest{}, fmt.Errorf("%s is a %s, not an image manifest", reference, desc.MediaType)
	}
	if err := artifact.CheckSize("manifest", desc); err != nil {
		return desc, ocispec.Manifest{}, err
	}
	b, err := content.FetchAll(ctx, s, desc)
	if err != nil {
		return desc, ocispec.Manifest{}, err
	}
	if err := artifact.CheckDocument(b); err != nil {
		return desc, ocispec.Manifest{}, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return desc, ocispec.Manifest{}, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	return desc, m, nil
}

// readManifest fetches and decodes a manifest (or the fields an index shares with it).
func (s *Store) readManifest(desc ocispec.Descriptor) (*manifestish, error) {
	if err := artifact.CheckSize("manifest", desc); err != nil {
		return nil, err
	}
	rc, err := s.Fetch(context.Background(), desc)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := cas.ReadAll(rc, desc.Digest, desc.Size)
	if err != nil {
		return nil, err
	}
	if err := artifact.CheckDocument(b); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	var m manifestish
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	return &m, nil
}

// manifestish holds the fields of an image manifest and an image index that lead to other blobs.
type manifestish struct {
	MediaType    string               `json:"mediaType"`
	ArtifactType string               `json:"artifactType"`
	Config       *ocispec.Descriptor  `json:"config"`
	Layers       []ocispec.Descriptor `json:"layers"`
	Manifests    []ocispec.Descriptor `json:"manifests"`
	Subject      *ocispec.Descriptor  `json:"subject"`
}

func (m *manifestish) children() []ocispec.Descriptor {
	var out []ocispec.Descriptor
	if m.Config != nil {
		out = append(out, *m.Config)
	}
	out = append(out, m.Layers...)
	return append(out, m.Manifests...)
}

func isManifest(mediaType string) bool {
	return artifact.IsManifest(mediaType) || artifact.IsIndex(mediaType)
}

// plain keeps the fields of a descriptor that identify content.
func plain(d ocispec.Descriptor) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: d.MediaType, ArtifactType: d.ArtifactType, Digest: d.Digest, Size: d.Size}
}

func notFound(err error) error {
	if errors.Is(err, cas.ErrNotFound) {
		return fmt.Errorf("%w: %w", errdef.ErrNotFound, err)
	}
	return err
}

func (s *Store) readIndex() (*ocispec.Index, error) {
	b, err := os.ReadFile(filepath.Join(s.root, indexFile))
	if errors.Is(err, os.ErrNotExist) {
		return emptyIndex(), nil
	}
	if err != nil {
		return nil, err
	}
	var idx ocispec.Index
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(s.root, indexFile), err)
	}
	return &idx, nil
}

func emptyIndex() *ocispec.Index {
	return &ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{}}
}

// updateIndex applies fn to index.json under the index lock and replaces the file atomically.
func (s *Store) updateIndex(fn func(*ocispec.Index) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.indexLock.TryLockContext(context.Background(), lockRetry); err != nil {
		return fmt.Errorf("lock %s: %w", indexFile, err)
	}
	defer s.indexLock.Unlock()
	idx, err := s.readIndex()
	if err != nil {
		return err
	}
	if err := fn(idx); err != nil {
		return err
	}
	if idx.Manifests == nil {
		idx.Manifests = []ocispec.Descriptor{}
	}
	b, err := json.Marshal(idx)
	if err != nil {
		return err
	}
	return diskio.WriteFileAtomic(filepath.Join(s.root, indexFile), b, 0o644)
}
