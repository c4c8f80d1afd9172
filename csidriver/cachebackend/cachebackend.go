// Package cachebackend connects the CSI driver and prepull to the node cache and the registry transport: Backend is
// the csidriver.Backend of a real node, and its Prepuller the prepull.Backend, so both reach registries, classify
// their errors, verify and pull the same way (cachebackend.go), prepulls with their bandwidth cap (limit.go).
package cachebackend

import (
	"context"
	"errors"
	"fmt"
	"strings"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/time/rate"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/archive"
	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/cache"
	"github.com/modelpack/modelpack/csidriver"
	"github.com/modelpack/modelpack/scan"
)

// Verifier checks an artifact before any of it is pulled (signature policy). It gets the digest reference
// (host/repository@sha256:…) the volume's reference resolved to, and the pod's namespace in
// csidriver.PodNamespace(ctx) ("" for a prepull). An error wrapping csidriver.ErrDenied refuses
// the volume with PERMISSION_DENIED, one wrapping csidriver.ErrUnsafeContent (a required scan attestation
// missing or reporting code) with FAILED_PRECONDITION; other errors (signatures unreachable) are classified like registry errors,
// so kubelet retries them.
type Verifier interface {
	Verify(ctx context.Context, digestRef string) error
}

// VerifierFunc adapts a function to a Verifier.
type VerifierFunc func(ctx context.Context, digestRef string) error

// Verify calls f.
func (f VerifierFunc) Verify(ctx context.Context, digestRef string) error { return f(ctx, digestRef) }

// Options configure a Backend.
type Options struct {
	// Remote is how registries are reached (mirrors, CA, the node's docker config); per-request credentials are
	// layered on top.
	Remote remote.Options
	// Verifier, if set, must accept an artifact before it is pulled or mounted.
	Verifier Verifier
	// Screen, if set, decides which files a model may hold by what loading them runs (package scan): every
	// layer is scanned once on the node, and a model it refuses is not mounted.
	Screen ScanPolicy
}

// ScanPolicy is the trust policy's content rules (signing.Policy: allowCode, exceptions), each chosen for a
// volume of a pod in namespace ("" for a prepull: unscoped rules only).
type ScanPolicy interface {
	// ScanNeeded is false when no scan result could refuse ref (its rule allows code).
	ScanNeeded(namespace, ref string) bool
	// AllowsScan refuses (wrapping ErrUnsafeContent) a file at path of ref whose report the rule does not allow.
	AllowsScan(namespace, ref, path string, r scan.Report) error
}

// Backend is a csidriver.Backend on a cache.Cache.
type Backend struct {
	cache *cache.Cache
	opts  Options
}

var _ csidriver.Backend = (*Backend)(nil)

// DriverHints name the driver's own settings in transport errors: it has no --insecure or --plain-http.
var DriverHints = remote.Hints{
	PlainHTTP: "list the registry in --plain-http-registries",
	TLS:       "give the registry's CA with --ca-file, or a hosts.toml for it under --hosts-dir (ca, or skip_verify)",
	Login: "a pod's credentials are its volume's pull secret: nodePublishSecretRef, a kubernetes.io/dockerconfigjson " +
		"Secret with credentials for this registry; without one a pod presents none, since the node's --registry-config " +
		"serves prepulls, and pods only under --image-pull-credentials-verification-policy NeverVerify",
}

// New returns a backend on an open cache.
func New(c *cache.Cache, opts Options) *Backend {
	if opts.Remote.Hints == (remote.Hints{}) {
		opts.Remote.Hints = DriverHints
	}
	return &Backend{cache: c, opts: opts}
}

// Ready is nil once the cache is open, which New requires.
func (b *Backend) Ready() error {
	if b.cache == nil {
		return errors.New("cache not open")
	}
	return nil
}

// volumeCredential is the one reading of a volume's pull secret: nil for none (the node's credentials).
func volumeCredential(creds csidriver.Credentials) (auth.CredentialFunc, error) {
	if len(creds.DockerConfigJSON) == 0 {
		return nil, nil
	}
	cf, err := remote.CredentialsFromDockerConfigJSON(creds.DockerConfigJSON)
	if err != nil {
		// The parse error may quote the secret.
		return nil, fmt.Errorf("%w: the pull secret is not a docker config", csidriver.ErrUnauthorized)
	}
	return cf, nil
}

func (b *Backend) repository(ref string, creds csidriver.Credentials) (*remote.Repository, registry.Reference, error) {
	opts := b.opts.Remote
	cf, err := volumeCredential(creds)
	if err != nil {
		return nil, registry.Reference{}, err
	}
	opts.Credential, opts.CredentialOnly = cf, creds.OwnOnly
	parsed, err := registry.ParseReference(ref)
	if err != nil {
		return nil, registry.Reference{}, fmt.Errorf("%w: %v", csidriver.ErrInvalidReference, err)
	}
	repo, parsed, err := remote.NewRepository(ref, opts)
	if err != nil {
		return nil, registry.Reference{}, classify(err)
	}
	return repo, parsed, nil
}

// Resolve asks the registry (or its mirror) for the reference's current digest.
func (b *Backend) Resolve(ctx context.Context, ref string, creds csidriver.Credentials) (digest.Digest, error) {
	repo, parsed, err := b.repository(ref, creds)
	if err != nil {
		return "", err
	}
	desc, err := repo.Resolve(ctx, parsed.Reference)
	if err != nil {
		return "", classify(err)
	}
	return desc.Digest, nil
}

// Local maps a complete manifest or index to the manifest to mount (the cache's platform for an index).
func (b *Backend) Local(d digest.Digest) (digest.Digest, bool) {
	desc, err := b.cache.Resolve(d)
	if err != nil {
		return "", false
	}
	return desc.Digest, true
}

// Verify runs the verifier, if any, on the digest reference ref resolved to, with the volume's credentials
// reachable through remote.CredentialFrom(ctx).
func (b *Backend) Verify(ctx context.Context, ref string, dgst digest.Digest, creds csidriver.Credentials) error {
	if b.opts.Verifier == nil {
		return nil
	}
	parsed, err := registry.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("%w: %v", csidriver.ErrInvalidReference, err)
	}
	cf, err := volumeCredential(creds)
	if err != nil {
		return err
	}
	switch {
	case creds.OwnOnly:
		ctx = remote.WithOnlyCredential(ctx, cf)
	case cf != nil:
		ctx = remote.WithCredential(ctx, cf)
	}
	if err := b.opts.Verifier.Verify(ctx, parsed.Registry+"/"+parsed.Repository+"@"+dgst.String()); err != nil {
		if errors.Is(err, csidriver.ErrDenied) || errors.Is(err, csidriver.ErrUnsafeContent) {
			return err // the message names the rule and the reason (a scan attestation's absence or verdict too)
		}
		return fmt.Errorf("verify signatures of %s: %w", dgst, classify(err))
	}
	return nil
}

// VolumeCredential is the credential the volume's pull secret holds for host, as the bytes that identify it
// (user, password and tokens), or nil when it holds none.
func (b *Backend) VolumeCredential(ctx context.Context, host string, creds csidriver.Credentials) ([]byte, error) {
	cf, err := volumeCredential(creds)
	if err != nil || cf == nil {
		return nil, err
	}
	return credentialBytes(ctx, cf, host)
}

// NodeCredential reports whether the node's docker config (or its helpers) holds a credential for host.
func (b *Backend) NodeCredential(ctx context.Context, host string) (bool, error) {
	store, err := remote.NewCredentialStore(b.opts.Remote.RegistryConfig)
	if err != nil {
		return false, err
	}
	m, err := credentialBytes(ctx, credentials.Credential(store), host)
	return m != nil, err
}

func credentialBytes(ctx context.Context, cf auth.CredentialFunc, host string) ([]byte, error) {
	c, err := cf(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("%w: credentials for %s: %v", csidriver.ErrUnauthorized, host, err)
	}
	if c == auth.EmptyCredential {
		return nil, nil
	}
	// Length-prefixed, so no two credentials give the same bytes.
	var b []byte
	for _, f := range []string{c.Username, c.Password, c.RefreshToken, c.AccessToken} {
		b = fmt.Appendf(b, "%d:%s", len(f), f)
	}
	return b, nil
}

// Pull pulls dgst into the cache; for an index, the cache picks the manifest of platform ("" for the node's).
func (b *Backend) Pull(ctx context.Context, ref string, dgst digest.Digest, platform string, creds csidriver.Credentials, progress func(csidriver.Progress)) (digest.Digest, error) {
	repo, _, err := b.repository(ref, creds)
	if err != nil {
		return "", err
	}
	desc, err := repo.Resolve(ctx, dgst.String())
	if err != nil {
		return "", classify(err)
	}
	if platform != "" {
		want, err := artifact.ParsePlatform(platform)
		if err != nil {
			return "", fmt.Errorf("%w: %v", csidriver.ErrInvalidReference, err)
		}
		desc.Platform = &want
	}
	return b.pull(ctx, repo, desc, creds, nil, func(p cache.Progress) {
		progress(csidriver.Progress{DoneBytes: p.Done, TotalBytes: p.Total})
	})
}

// Prove asks ref's registry, with creds, whether it serves every part of the content of manifest (chosen from
// top) that the node holds, without fetching any.
func (b *Backend) Prove(ctx context.Context, ref string, top, manifest digest.Digest, creds csidriver.Credentials) error {
	repo, _, err := b.repository(ref, creds)
	if err != nil {
		return err
	}
	if err := b.cache.Prove(ctx, source{repo, creds.Key()}, top, manifest); err != nil {
		return classify(err)
	}
	return nil
}

// Screen applies the scan policy to the files of manifest (chosen from top) of ref's repository: nil when there
// is no policy, when the rule allows code, or when every file is data; otherwise the first refusal, naming the file,
// its format and the first callable it would run.
func (b *Backend) Screen(ctx context.Context, ref string, top, manifest digest.Digest) error {
	if b.opts.Screen == nil {
		return nil
	}
	parsed, err := registry.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("%w: %v", csidriver.ErrInvalidReference, err)
	}
	model := parsed.Registry + "/" + parsed.Repository + "@" + top.String()
	ns := csidriver.PodNamespace(ctx)
	if !b.opts.Screen.ScanNeeded(ns, model) {
		return nil
	}
	layers, err := b.cache.Scan(manifest)
	if err != nil {
		return classify(err)
	}
	for _, l := range layers {
		for _, f := range perFile(l) {
			if err := b.opts.Screen.AllowsScan(ns, model, f.path, f.report); err != nil {
				return err
			}
		}
	}
	return nil
}

type fileReport struct {
	path   string
	report scan.Report
}

// perFile splits a layer's report into its files': a raw layer is one file; a tar layer's findings name theirs,
// and a fault of the archive itself stays with the layer's path.
func perFile(l cache.ScannedLayer) []fileReport {
	r := l.Report
	if r.Verdict == scan.Data {
		return nil
	}
	if l.Format == artifact.FormatRaw {
		return []fileReport{{l.Path, r}}
	}
	byFile := map[string]*scan.Report{}
	var order []string
	for _, f := range r.Findings {
		if f.Verdict == scan.Data {
			continue
		}
		fr := byFile[f.File]
		if fr == nil {
			fr = &scan.Report{Format: r.Format, Verdict: f.Verdict, Reason: f.Detail}
			byFile[f.File] = fr
			order = append(order, f.File)
		}
		if f.Verdict == scan.Code {
			fr.Verdict = scan.Code
		}
		fr.Findings = append(fr.Findings, f)
	}
	if len(order) == 0 {
		return []fileReport{{l.Path, r}}
	}
	out := make([]fileReport, 0, len(order))
	for _, name := range order {
		p := name
		if p == "" {
			p = l.Path
		}
		out = append(out, fileReport{p, *byFile[name]})
	}
	return out
}

// Hold keeps manifest's content from GC until release.
func (b *Backend) Hold(manifest digest.Digest) (func(), error) {
	_, release, err := b.cache.Hold(manifest)
	return release, err
}

// pull brings desc from repo, read with creds, into the cache, its reads held to lim (nil: no limit), and returns
// the manifest chosen.
func (b *Backend) pull(ctx context.Context, repo *remote.Repository, desc ocispec.Descriptor, creds csidriver.Credentials, lim *rate.Limiter, progress func(cache.Progress)) (digest.Digest, error) {
	var src oras.ReadOnlyTarget = source{repo, creds.Key()}
	if lim != nil {
		src = limitedTarget{ReadOnlyTarget: src, lim: lim}
	}
	got, err := b.cache.Pull(ctx, src, desc, progress)
	if err != nil {
		return "", classify(err)
	}
	return got.Digest, nil
}

// source is a repository read with one caller's credentials. The cache tells the sources of a shared pull apart by
// String, so callers of one repository with different credentials are different sources: each is asked, and
// fails, on its own.
type source struct {
	*remote.Repository
	creds string // csidriver.Credentials.Key
}

func (s source) String() string { return s.Repository.String() + "#" + s.creds }

// Acquire holds the view of a manifest for owner.
func (b *Backend) Acquire(owner string, manifest digest.Digest, sel csidriver.Selector) (string, error) {
	cs := cache.Selector{Include: sel.Include}
	for _, k := range sel.Kinds {
		kind, err := artifact.ParseKind(k)
		if err != nil {
			return "", err
		}
		cs.Kinds = append(cs.Kinds, kind)
	}
	dir, err := b.cache.Acquire(owner, manifest, cs)
	if err != nil {
		return "", classify(err)
	}
	return dir, nil
}

// Release drops owner's view.
func (b *Backend) Release(owner string) error { return b.cache.Release(owner) }

// Owners lists the owners of views whose names start with prefix.
func (b *Backend) Owners(prefix string) ([]string, error) {
	refs, err := b.refs(prefix)
	var out []string
	for _, r := range refs {
		out = append(out, r.Owner)
	}
	return out, err
}

// refs are the cache's holds on views whose owners' names start with prefix: the driver's volumes, or the pins.
func (b *Backend) refs(prefix string) ([]cache.Ref, error) {
	refs, err := b.cache.Refs()
	if err != nil {
		return nil, err
	}
	var out []cache.Ref
	for _, r := range refs {
		if strings.HasPrefix(r.Owner, prefix) {
			out = append(out, r)
		}
	}
	return out, nil
}

// Stats reads the cache's usage.
func (b *Backend) Stats() csidriver.Stats {
	u, err := b.cache.Usage()
	if err != nil {
		return csidriver.Stats{}
	}
	return csidriver.Stats{CacheBytes: u.Bytes, Views: u.Views, Refs: u.Refs}
}

// isBadContent reports hostile or corrupt content: the artifact is at fault, not the node or the registry's health.
func isBadContent(err error) bool {
	for _, cause := range []error{archive.ErrUnsafePath, archive.ErrLinkEscape, archive.ErrSpecialFile,
		artifact.ErrPathConflict, artifact.ErrMalformed, cache.ErrDigestMismatch, cache.ErrSizeMismatch} {
		if errors.Is(err, cause) {
			return true
		}
	}
	return false
}

// classify maps transport and cache errors to the driver's sentinels, keeping the message.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var sentinel error
	switch cause := remote.Classify(err); cause {
	case remote.ErrDigestMismatch, remote.ErrSizeMismatch, remote.ErrRedirectRefused:
		sentinel = csidriver.ErrBadContent
	case remote.ErrTLS, remote.ErrNotOCI:
		sentinel = csidriver.ErrUnavailable
	case csidriver.ErrUnauthorized, csidriver.ErrForbidden, csidriver.ErrNotFound, csidriver.ErrUnavailable, csidriver.ErrNoSpace:
		sentinel = cause // internal/errdef's, which the transport and the driver share
	}
	switch {
	case sentinel != nil:
	case errors.Is(err, artifact.ErrCredentialsInReference):
		sentinel = csidriver.ErrInvalidReference
	case errors.Is(err, remote.ErrHostsConfig):
		sentinel = csidriver.ErrUnavailable // the node's configuration: fixed there, then retried
	case isBadContent(err):
		sentinel = csidriver.ErrBadContent
	case errors.Is(err, cache.ErrTooLarge):
		sentinel = csidriver.ErrUnsupported
	}
	if sentinel == nil || errors.Is(err, sentinel) {
		return err // unknown, or already the driver's own (the driver, cache and transport share internal/errdef)
	}
	return fmt.Errorf("%w: %w", sentinel, err)
}
