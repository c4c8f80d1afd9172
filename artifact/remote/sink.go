package remote

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry"

	"github.com/modelpack/modelpack/cas"
)

// Sink receives a pack straight into a registry (`pack --push`), with no local copy: each blob is read once to
// learn its digest, skipped if the registry has it, and read again to upload. It implements pack.Sink and is safe
// for concurrent use.
type Sink struct {
	repo     *Repository
	t        *tracker
	sessions UploadSessions
	root     ocispec.Descriptor
	ref      string
}

// PackSink returns a sink pushing into repo, tagging the manifest with repo's reference unless Commit names a tag.
// With sessions, a large blob goes through a resumable upload session, as Push sends it, so a pack --push run again after an
// interruption sends only what the registry's upload session lacks.
func PackSink(repo *Repository, rep Reporter, sessions UploadSessions) *Sink {
	return &Sink{repo: repo, t: newTracker(rep), sessions: sessions}
}

// AddBlob hashes the blob, then uploads it unless the registry already has it. Progress and the result name the
// blob by desc's annotations.
func (s *Sink) AddBlob(ctx context.Context, desc ocispec.Descriptor, open func() (io.ReadCloser, error)) (ocispec.Descriptor, error) {
	d, n, err := hashBlob(open)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc.Digest, desc.Size = d, n
	return s.upload(ctx, desc, func(context.Context, ocispec.Descriptor, int64) (io.ReadCloser, int64, error) {
		rc, err := open()
		return rc, 0, err
	})
}

// AddStatedBlob uploads a blob whose digest and size are known before it is read (a file the Hugging Face Hub
// states the sha256 of): it is read once, straight from its source into the upload, and not at all if the
// registry has it. The upload fails rather than end on bytes that do not match desc (cas.Verifier; the registry
// checks the digest as well).
func (s *Sink) AddStatedBlob(ctx context.Context, desc ocispec.Descriptor, open func(ctx context.Context, offset int64) (io.ReadCloser, int64, error)) (ocispec.Descriptor, error) {
	return s.upload(ctx, desc, func(ctx context.Context, _ ocispec.Descriptor, offset int64) (io.ReadCloser, int64, error) {
		rc, start, err := open(ctx, offset)
		if err != nil || start != 0 {
			// A resumed upload's first bytes are in the registry's session; the registry checks the digest of the
			// whole blob when the upload is committed.
			return rc, start, err
		}
		return verifiedBody{cas.NewVerifier(desc.Digest, desc.Size).Reader(rc), rc}, 0, nil
	})
}

type verifiedBody struct {
	io.Reader
	io.Closer
}

// upload sends desc's bytes from open unless the registry already has them.
func (s *Sink) upload(ctx context.Context, desc ocispec.Descriptor, open blobOpener) (ocispec.Descriptor, error) {
	ok, err := s.repo.Exists(ctx, desc)
	if err != nil {
		return ocispec.Descriptor{}, withOp("push", s.repo, err)
	}
	if ok {
		s.t.finish(desc, StatusExists, nil)
		return desc, nil
	}
	m := s.t.meter(desc, 0)
	if s.sessions != nil && desc.Size > resumableMin {
		err = s.repo.pushResumable(ctx, desc, func(ctx context.Context, offset int64) (io.ReadCloser, error) {
			return openAt(ctx, desc, offset, open)
		}, m, s.sessions)
	} else {
		err = pushBlob(ctx, s.repo, desc, func(ctx context.Context) (io.ReadCloser, error) { return openAt(ctx, desc, 0, open) }, m)
	}
	if err != nil {
		s.t.finish(desc, StatusFailed, err)
		return ocispec.Descriptor{}, withOp("push", s.repo, err)
	}
	s.t.finish(desc, StatusTransferred, nil)
	return desc, nil
}

func hashBlob(open func() (io.ReadCloser, error)) (digest.Digest, int64, error) {
	rc, err := open()
	if err != nil {
		return "", 0, err
	}
	defer rc.Close()
	dg := digest.Canonical.Digester()
	n, err := io.CopyBuffer(dg.Hash(), rc, make([]byte, ioBufferSize))
	if err != nil {
		return "", 0, err
	}
	return dg.Digest(), n, nil
}

// Commit uploads the manifest and tags it: with tag's tag part (tag may be a full reference), else the
// repository's reference. Blobs are all in the registry by then, so the tag never points at missing content.
func (s *Sink) Commit(ctx context.Context, manifest ocispec.Descriptor, manifestBytes []byte, tag string) error {
	ref := s.repo.Reference.Reference
	if tag != "" {
		ref = tag
		if strings.ContainsAny(tag, "/@") {
			parsed, err := registry.ParseReference(tag)
			if err != nil {
				return fmt.Errorf("invalid tag %q: %w", tag, err)
			}
			ref = parsed.Reference
		}
	}
	var err error
	if ref == "" {
		err = s.repo.Push(ctx, manifest, bytes.NewReader(manifestBytes))
	} else {
		err = s.repo.PushReference(ctx, manifest, bytes.NewReader(manifestBytes), ref)
	}
	if err != nil {
		return withOp("push", s.repo, err)
	}
	s.root, s.ref = manifest, ref
	return nil
}

// Result summarises what the sink sent.
func (s *Sink) Result() *Result {
	r := s.t.result("", s.root)
	ref := s.repo.Reference
	ref.Reference = s.ref
	r.Reference = ref.String()
	return r
}
