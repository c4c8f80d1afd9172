package csidriver

import (
	"context"
	"errors"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/internal/errdef"
)

// Backend is what the node server needs from the node cache and the registry transport. The driver decides
// when to ask the registry and when to pull (Kubernetes' pullPolicy semantics, joining pulls, deadlines); the
// backend does the work.
type Backend interface {
	// Ready returns nil once the cache is open and usable; Probe reports ready only then.
	Ready() error
	// Resolve asks the registry what ref (a parsed reference: host/repository[:tag|@digest]) points to now and
	// returns the digest of the top-level manifest or index.
	Resolve(ctx context.Context, ref string, creds Credentials) (digest.Digest, error)
	// Local returns the manifest to mount for d when d and everything it references are complete in the cache:
	// d itself for a manifest, the node's platform's manifest for an index.
	Local(d digest.Digest) (manifest digest.Digest, ok bool)
	// Verify applies the node's trust policy to ref's repository at dgst, before anything of dgst is pulled and
	// on every publish of content already here (the policy, or the repository, may differ from the one it was
	// pulled under). An error wrapping ErrDenied refuses the volume.
	Verify(ctx context.Context, ref string, dgst digest.Digest, creds Credentials) error
	// Prove asks ref's registry, with creds, whether it serves every part of the content of manifest (chosen from
	// top: the manifest itself or its index) that the node holds, fetching none: a digest is no right to read, so
	// content that came under another name, or for another caller, is shared only so. An error wrapping
	// ErrNotFound names the first part the registry does not serve.
	Prove(ctx context.Context, ref string, top, manifest digest.Digest, creds Credentials) error
	// Pull makes the content of dgst complete in the cache and returns the manifest to mount: dgst itself, or,
	// for an index, the manifest matching platform ("" meaning the node's). It reports progress as it goes. Blobs
	// the node already held are shared only when ref's registry serves them to creds (see Prove).
	Pull(ctx context.Context, ref string, dgst digest.Digest, platform string, creds Credentials, progress func(Progress)) (digest.Digest, error)
	// Screen applies the trust policy's content rules to the files of manifest (chosen from top) of ref: what
	// loading each would run (package scan). An error wrapping ErrUnsafeContent refuses the volume, naming the file.
	Screen(ctx context.Context, ref string, top, manifest digest.Digest) error
	// Hold keeps manifest's content, complete in the cache, from eviction until release is called: a publish
	// holds what it found from then until its view is acquired. An error wrapping ErrNotFound: it is not (or no
	// longer) complete.
	Hold(manifest digest.Digest) (release func(), err error)
	// Acquire returns a read-only directory showing the selected part of a pulled manifest, held for owner until
	// Release. Owners of the same manifest and selector share one view. Acquiring again for the same owner returns
	// the same view.
	Acquire(owner string, manifest digest.Digest, sel Selector) (string, error)
	// Release drops owner's hold on its view. Releasing an unknown owner is not an error.
	Release(owner string) error
	// Owners lists the owners holding views whose names start with prefix.
	Owners(prefix string) ([]string, error)
	// Stats reports the cache's size for the metrics.
	Stats() Stats
	// VolumeCredential returns the credential creds present to a registry host, as bytes to hash and never to
	// keep, or nil when they hold none for it (requests then present the node's credentials, or none).
	VolumeCredential(ctx context.Context, host string, creds Credentials) ([]byte, error)
	// NodeCredential reports whether the node's own credentials hold one for host.
	NodeCredential(ctx context.Context, host string) (bool, error)
}

// Selector picks a partial view of a model.
type Selector struct {
	// Kinds are ModelPack layer kinds (weight, weight.config, doc, code, dataset); empty means all.
	Kinds []string
	// Include are globs over paths inside the model; empty means all.
	Include []string
}

// Progress of a pull.
type Progress struct {
	DoneBytes, TotalBytes int64
	// DoneLayers and TotalLayers count blobs; zero totals mean not yet known.
	DoneLayers, TotalLayers int
}

// Stats are cache figures for the metrics.
type Stats struct {
	CacheBytes int64
	// Views are the views built (one per model and selector, shared by its volumes); Refs the holds on them.
	Views, Refs int
}

// Errors a Backend wraps so the driver can return the CSI code the spec asks for.
var (
	ErrUnauthorized     = errdef.ErrUnauthorized
	ErrForbidden        = errdef.ErrForbidden
	ErrNotFound         = errdef.ErrNotFound
	ErrUnavailable      = errdef.ErrUnavailable
	ErrNoSpace          = errdef.ErrNoSpace
	ErrInvalidReference = errors.New("invalid reference")
	// ErrDenied is a policy refusal (an unsigned or untrusted artifact): signing.ErrDenied.
	ErrDenied = errdef.ErrDenied
	// ErrUnsafeContent is a model file whose loading runs code (a pickle outside the scanner's allowlist) or that
	// the scanner cannot vouch for, under a rule that does not allow it: signing.ErrUnsafeContent.
	ErrUnsafeContent = errdef.ErrUnsafeContent
	// ErrUnsupported is content the node cannot mount (an unknown media type, a layer over the size limits):
	// cache.ErrUnsupported.
	ErrUnsupported = errdef.ErrUnsupported
	// ErrBadContent is hostile or corrupt content: bytes that do not match their digest or size, an archive
	// entry escaping the model or naming a device, layers that claim the same path.
	ErrBadContent = errors.New("content refused")
)
