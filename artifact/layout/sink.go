package layout

import (
	"bytes"
	"context"
	"fmt"
	"io"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/artifact/pack"
)

// Sink is the pack.Sink that writes into the store.
type Sink struct{ s *Store }

var (
	_ pack.Sink       = (*Sink)(nil)
	_ pack.TagChecker = (*Sink)(nil)
	_ pack.StatedSink = (*Sink)(nil)
)

// Sink returns a pack.Sink that writes into the store. Each blob is hashed and written in one pass (cas.Write);
// the tag is written after the manifest and every blob are committed.
func (s *Store) Sink() *Sink { return &Sink{s: s} }

// CheckTag refuses a tag that is not a valid store reference, before Pack writes anything.
func (k *Sink) CheckTag(tag string) error {
	_, err := ParseReference(tag)
	return err
}

// AddBlob stores what open returns, reading it once.
func (k *Sink) AddBlob(ctx context.Context, desc ocispec.Descriptor, open func() (io.ReadCloser, error)) (ocispec.Descriptor, error) {
	if err := k.s.holdWriterLock(ctx); err != nil {
		return ocispec.Descriptor{}, err
	}
	rc, err := open()
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer rc.Close()
	d, n, err := k.s.blobs.Write(ctx, rc)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc.Digest, desc.Size = d, n
	return desc, nil
}

// AddStatedBlob stores a blob whose digest and size are known before it is read (a file the Hugging Face Hub
// states the sha256 of): one the store holds is not read at all, one an earlier run left partial resumes from its
// last byte, and bytes that do not hash to desc.Digest are dropped.
func (k *Sink) AddStatedBlob(ctx context.Context, desc ocispec.Descriptor, open func(ctx context.Context, offset int64) (io.ReadCloser, int64, error)) (ocispec.Descriptor, error) {
	if err := k.s.holdWriterLock(ctx); err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := k.s.blobs.Ingest(ctx, desc.Digest, desc.Size, open); err != nil {
		return ocispec.Descriptor{}, err
	}
	return desc, nil
}

// Commit stores the manifest and then tags it, so a tag never reaches a blob that is not committed. Committed
// blobs become durable in the background; after a power loss cas re-hashes those that were not yet, and a blob
// that lost its bytes is quarantined (the tag then reports it missing rather than serving it). An empty tag
// stores the manifest untagged.
func (k *Sink) Commit(ctx context.Context, manifest ocispec.Descriptor, manifestBytes []byte, tag string) error {
	if tag != "" {
		if _, err := ParseReference(tag); err != nil {
			return err
		}
	}
	if err := k.s.Push(ctx, manifest, bytes.NewReader(manifestBytes)); err != nil {
		return fmt.Errorf("store manifest: %w", err)
	}
	if tag == "" {
		return nil
	}
	return k.s.Tag(ctx, manifest, tag)
}
