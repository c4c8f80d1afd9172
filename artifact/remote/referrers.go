package remote

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	oras "oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote/errcode"
)

// AttachOptions describe a referrer to attach.
type AttachOptions struct {
	// ArtifactType is the referrer's artifactType (required, as oras attach requires it).
	ArtifactType string
	// Files are attached as layers, each titled (org.opencontainers.image.title) with its base name, as oras does.
	Files []string
	// Annotations go on the referrer's manifest.
	Annotations map[string]string
	// Reporter, if set, receives per-blob progress.
	Reporter Reporter
}

// Attach pushes a manifest whose subject is the manifest repo's reference names, with opts.Files as its layers:
// what `oras attach` makes (an OCI 1.1 image manifest, the empty config, artifactType set). oras-go keeps the
// referrers tag (sha256-<hex>) up to date where the registry has no referrers API, so discover and oras find it
// either way.
func Attach(ctx context.Context, repo *Repository, opts AttachOptions) (*Result, error) {
	if opts.ArtifactType == "" {
		return nil, errors.New("attach: --artifact-type is required (e.g. application/spdx+json, application/vnd.cncf.model.card)")
	}
	if len(opts.Files) == 0 {
		return nil, errors.New("attach: name at least one FILE to attach")
	}
	ref := repo.Reference.Reference
	if ref == "" {
		return nil, fmt.Errorf("attach %s: the reference needs a tag or digest", repo)
	}
	subject, err := repo.Resolve(ctx, ref)
	if err != nil {
		return nil, withOp("attach", repo, err)
	}
	t := newTracker(opts.Reporter)
	titles := map[string]string{}
	layers := make([]ocispec.Descriptor, 0, len(opts.Files))
	for _, f := range opts.Files {
		title := filepath.Base(f)
		if prev, ok := titles[title]; ok {
			return nil, fmt.Errorf("attach: %s and %s have the same name %q; a referrer's files are named by base name", prev, f, title)
		}
		titles[title] = f
		desc, err := pushFile(ctx, repo, f, title, t)
		if err != nil {
			return nil, withOp("attach", repo, err)
		}
		layers = append(layers, desc)
	}
	root, err := oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, opts.ArtifactType, oras.PackManifestOptions{
		Subject:             &subject,
		Layers:              layers,
		ManifestAnnotations: opts.Annotations,
	})
	if err != nil {
		return nil, withOp("attach", repo, err)
	}
	t.finish(root, StatusTransferred, nil)
	res := t.result(repo.Reference.Registry+"/"+repo.Reference.Repository+"@"+root.Digest.String(), root)
	res.Descriptor.ArtifactType = opts.ArtifactType
	return res, nil
}

// pushFile uploads one file as a layer titled title, hashing it first (the descriptor must be known to push).
func pushFile(ctx context.Context, repo *Repository, path, title string, t *tracker) (ocispec.Descriptor, error) {
	f, err := os.Open(path)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	if !fi.Mode().IsRegular() {
		return ocispec.Descriptor{}, fmt.Errorf("%s is not a regular file", path)
	}
	d, err := digest.SHA256.FromReader(f)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("read %s: %w", path, err)
	}
	desc := ocispec.Descriptor{MediaType: "application/vnd.oci.image.layer.v1.tar", Digest: d, Size: fi.Size(),
		Annotations: map[string]string{ocispec.AnnotationTitle: title}}
	if ok, err := repo.Exists(ctx, desc); err == nil && ok {
		t.finish(desc, StatusExists, nil)
		return desc, nil
	}
	if _, err := f.Seek(0, 0); err != nil {
		return ocispec.Descriptor{}, err
	}
	m := t.meter(desc, 0)
	if err := repo.Push(ctx, desc, &countingReader{r: f, fn: m.add}); err != nil && !errors.Is(err, errdef.ErrAlreadyExists) {
		t.finish(desc, StatusFailed, err)
		return ocispec.Descriptor{}, err
	}
	t.finish(desc, StatusTransferred, nil)
	return desc, nil
}

// Referrer is one node of the referrers tree discover prints: a manifest referring to its parent.
type Referrer struct {
	ocispec.Descriptor
	// Referrers are the manifests referring to this one (a signature of an SBOM).
	Referrers []Referrer `json:"referrers,omitempty"`
}

// maxReferrerDepth bounds the walk down chains of referrers (a signature of an SBOM of a model is three), so a
// registry answering with a cycle cannot hold discover.
const maxReferrerDepth = 8

// ListReferrers lists the referrers of root in src, those of artifactType only if it is set, and theirs in turn
// (of any type), sorted by artifactType then digest. src is a registry repository (OCI 1.1 referrers API, or the
// referrers tag where the registry lacks it, as oras-go reads both) or any graph store (the local store, an OCI
// layout).
func ListReferrers(ctx context.Context, src content.ReadOnlyGraphStorage, root ocispec.Descriptor, artifactType string) ([]Referrer, error) {
	return listReferrers(ctx, src, root, artifactType, 0, map[digest.Digest]bool{root.Digest: true})
}

func listReferrers(ctx context.Context, src content.ReadOnlyGraphStorage, node ocispec.Descriptor, artifactType string, depth int, seen map[digest.Digest]bool) ([]Referrer, error) {
	if depth >= maxReferrerDepth {
		return nil, nil
	}
	descs, err := registry.Referrers(ctx, src, node, artifactType)
	if err != nil {
		return nil, err
	}
	sort.Slice(descs, func(i, j int) bool {
		if descs[i].ArtifactType != descs[j].ArtifactType {
			return descs[i].ArtifactType < descs[j].ArtifactType
		}
		return descs[i].Digest < descs[j].Digest
	})
	out := []Referrer{}
	for _, d := range descs {
		if seen[d.Digest] {
			continue
		}
		seen[d.Digest] = true
		children, err := listReferrers(ctx, src, d, "", depth+1, seen)
		if err != nil {
			return nil, err
		}
		out = append(out, Referrer{Descriptor: d, Referrers: children})
	}
	return out, nil
}

// DeleteOptions tune Delete.
type DeleteOptions struct {
	// Confirm, if set, is asked before anything is deleted with the digest the reference resolved to; false leaves
	// the manifest alone (Delete returns ErrCancelled).
	Confirm func(ocispec.Descriptor) bool
	// IgnoreMissing makes a reference the registry does not hold a success (Delete returns ErrMissing), as oras
	// manifest delete --force does.
	IgnoreMissing bool
}

var (
	// ErrCancelled: the confirmation was refused; nothing was deleted.
	ErrCancelled = errors.New("cancelled, nothing deleted")
	// ErrMissing: the reference names no manifest and IgnoreMissing was set.
	ErrMissing = errors.New("no such manifest")
)

// Delete deletes the manifest repo's reference names: a digest as it is, a tag resolved to its digest first (the
// registry deletes manifests by digest, and with it every tag naming it), as oras manifest delete does. A registry
// that refuses deletes (distribution without storage.delete.enabled answers 405 UNSUPPORTED) is named with how to
// enable them.
func Delete(ctx context.Context, repo *Repository, opts DeleteOptions) (ocispec.Descriptor, error) {
	ref := repo.Reference.Reference
	if ref == "" {
		return ocispec.Descriptor{}, fmt.Errorf("delete %s: name the manifest by tag or digest (REPOSITORY:TAG or REPOSITORY@DIGEST)", repo)
	}
	desc, err := repo.origin.repo.Manifests().Resolve(ctx, ref)
	if err != nil {
		if errors.Is(err, errdef.ErrNotFound) {
			if opts.IgnoreMissing {
				return ocispec.Descriptor{}, ErrMissing
			}
			if repo.speaksOCI(ctx) {
				return ocispec.Descriptor{}, &Error{Op: "delete", Registry: repo.Reference.Registry, Repository: repo.Reference.Repository,
					Kind: ErrNotFound, Err: fmt.Errorf("no manifest %s (--force treats a missing one as deleted): %w", ref, ErrNotFound)}
			}
		}
		return ocispec.Descriptor{}, withOp("delete", repo, repo.manifestErr(ctx, ref, err))
	}
	if opts.Confirm != nil && !opts.Confirm(desc) {
		return desc, ErrCancelled
	}
	if err := repo.origin.repo.Manifests().Delete(ctx, desc); err != nil {
		if refusesDeletes(err) {
			return desc, &Error{Op: "delete", Registry: repo.Reference.Registry, Repository: repo.Reference.Repository,
				Subject: "manifest " + desc.Digest.String(), Err: fmt.Errorf("the registry does not allow deletes (%w); "+
					"distribution allows them with storage.delete.enabled: true in its config.yml "+
					"(or REGISTRY_STORAGE_DELETE_ENABLED=true); other registries have a setting or a policy for it", err)}
		}
		if errors.Is(err, errdef.ErrNotFound) && opts.IgnoreMissing {
			return desc, ErrMissing
		}
		return desc, withOp("delete", repo, err)
	}
	return desc, nil
}

// refusesDeletes reports a registry answer that deletes are off: 405, or the UNSUPPORTED error code.
func refusesDeletes(err error) bool {
	var resp *errcode.ErrorResponse
	if !errors.As(err, &resp) {
		return false
	}
	if resp.StatusCode == http.StatusMethodNotAllowed {
		return true
	}
	for _, e := range resp.Errors {
		if e.Code == errcode.ErrorCodeUnsupported {
			return true
		}
	}
	return false
}

// ReadManifest reads the image manifest reference names in a registry repository, this platform's from an index,
// as fetch chooses it.
func ReadManifest(ctx context.Context, repo *Repository, reference string) (ocispec.Descriptor, ocispec.Manifest, error) {
	return resolveManifest(ctx, repo, reference)
}
