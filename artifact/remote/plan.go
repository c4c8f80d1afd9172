package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"

	"github.com/modelpack/modelpack/artifact"
)

// Plan is what a push or copy would do, found by reading the source and asking the destination (HEAD) about
// each manifest and blob: nothing is written anywhere. It is what push --dry-run and copy --dry-run print.
type Plan struct {
	// Reference is the destination, with the tag the transfer would set.
	Reference string             `json:"reference"`
	Root      ocispec.Descriptor `json:"root"`
	// TagDigest is what the destination's tag names now; empty if the tag does not exist.
	TagDigest digest.Digest `json:"tagDigest,omitempty"`
	// Items are the manifests and blobs, the root first, each once.
	Items []PlannedItem `json:"items"`
	// Send is the bytes that would be uploaded: those of the items the destination lacks and cannot mount.
	Send int64 `json:"send"`
}

// PlannedItem is one manifest or blob of a plan.
type PlannedItem struct {
	ocispec.Descriptor
	// Role is manifest, index, config or layer; referrer for a manifest found through the referrers API or
	// cosign's tags (copy -r), whose Tag is then set for a cosign tag.
	Role string `json:"role"`
	Tag  string `json:"tag,omitempty"`
	// Exists says the destination has it (HEAD answered 200): it would not be sent.
	Exists bool `json:"exists"`
	// MountFrom is the repository of the destination's registry it would be mounted from instead of sent.
	MountFrom string `json:"mountFrom,omitempty"`
}

// PlanPush is Push's plan: the artifact srcRef names in src, against dst.
func PlanPush(ctx context.Context, src oras.ReadOnlyTarget, srcRef string, dst *Repository, opts TransferOptions) (*Plan, error) {
	dstRef := dst.Reference.Reference
	if dstRef == "" {
		return nil, fmt.Errorf("push %s: the destination needs a tag or digest", dst)
	}
	if _, err := src.Resolve(ctx, srcRef); err != nil {
		return nil, fmt.Errorf("push %s: %s is not in the local store: %w", dst, srcRef, err)
	}
	p, err := planGraph(ctx, src, srcRef, dst, dstRef, "", opts)
	if err != nil {
		return nil, withOp("push", dst, err)
	}
	return p, nil
}

// PlanCopy is Copy's plan.
func PlanCopy(ctx context.Context, src, dst *Repository, opts TransferOptions) (*Plan, error) {
	srcRef, dstRef, err := copyRefs(src, dst)
	if err != nil {
		return nil, err
	}
	mountFrom := ""
	if src.Reference.Registry == dst.Reference.Registry && src.Reference.Repository != dst.Reference.Repository {
		mountFrom = src.Reference.Repository
	}
	p, err := planGraph(ctx, src, srcRef, dst, dstRef, mountFrom, opts)
	if err != nil {
		return nil, withOp("copy", dst, err)
	}
	return p, nil
}

// planGraph walks what copyGraph would copy, in the same order of discovery, asking dst about each node.
func planGraph(ctx context.Context, src oras.ReadOnlyTarget, srcRef string, dst *Repository, dstRef, mountFrom string, opts TransferOptions) (*Plan, error) {
	root, err := src.Resolve(ctx, srcRef)
	if err != nil {
		return nil, err
	}
	ref := dst.Reference
	ref.Reference = dstRef
	p := &Plan{Reference: ref.String(), Root: root}
	if !isDigest(dstRef) {
		switch d, err := dst.Resolve(ctx, dstRef); {
		case err == nil:
			p.TagDigest = d.Digest
		case !errors.Is(err, errdef.ErrNotFound):
			return nil, err
		}
	}
	seen := map[digest.Digest]bool{}
	var visit func(d ocispec.Descriptor, role, tag string) error
	visit = func(d ocispec.Descriptor, role, tag string) error {
		if seen[d.Digest] || strings.Contains(d.MediaType, "foreign") {
			return nil
		}
		seen[d.Digest] = true
		item := PlannedItem{Descriptor: d, Role: role, Tag: tag}
		ok, err := dst.Exists(ctx, d)
		if err != nil {
			return err
		}
		item.Exists = ok
		if !ok && !isManifest(d) {
			item.MountFrom = mountFrom
			if item.MountFrom == "" && opts.Sources != nil {
				for _, r := range opts.Sources.BlobRepos(dst.Reference.Registry, d.Digest) {
					if r != dst.Reference.Repository {
						item.MountFrom = r
						break
					}
				}
			}
		}
		if !ok && item.MountFrom == "" {
			p.Send += d.Size
		}
		p.Items = append(p.Items, item)
		if !isManifest(d) {
			return nil
		}
		if err := artifact.CheckSize("manifest", d); err != nil {
			return err
		}
		b, err := content.FetchAll(ctx, src, d)
		if err != nil {
			return err
		}
		var m struct {
			Config    *ocispec.Descriptor  `json:"config"`
			Layers    []ocispec.Descriptor `json:"layers"`
			Manifests []ocispec.Descriptor `json:"manifests"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			return fmt.Errorf("manifest %s: %w", d.Digest, err)
		}
		for _, c := range m.Manifests {
			r := "manifest"
			if artifact.IsIndex(c.MediaType) {
				r = "index"
			}
			if err := visit(c, r, ""); err != nil {
				return err
			}
		}
		if m.Config != nil {
			if err := visit(*m.Config, "config", ""); err != nil {
				return err
			}
		}
		for _, l := range m.Layers {
			if err := visit(l, "layer", ""); err != nil {
				return err
			}
		}
		return nil
	}
	rootRole := "manifest"
	if artifact.IsIndex(root.MediaType) {
		rootRole = "index"
	}
	if err := visit(root, rootRole, ""); err != nil {
		return nil, err
	}
	if !opts.Referrers {
		return p, nil
	}
	// copy -r: the artifacts referring to the root (and to each manifest of an index), then cosign's tags.
	if g, ok := src.(content.ReadOnlyGraphStorage); ok {
		subjects := []ocispec.Descriptor{root}
		for i := 0; i < len(subjects); i++ {
			preds, err := g.Predecessors(ctx, subjects[i])
			if err != nil {
				return nil, err
			}
			for _, pd := range preds {
				if !seen[pd.Digest] {
					if err := visit(pd, "referrer", ""); err != nil {
						return nil, err
					}
					subjects = append(subjects, pd) // a signature of a signature, an SBOM's attestation
				}
			}
		}
	}
	return p, copyCosignTags(ctx, src, dst, root, func(tag string) error {
		d, err := src.Resolve(ctx, tag)
		if err != nil {
			return err
		}
		return visit(d, "referrer", tag)
	})
}
