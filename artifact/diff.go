package artifact

import (
	"sort"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// FileChange is one path that differs between two manifests: a raw file, or the directory a tar layer was made
// from. Kind and Size are the new side's (the old side's for a removed path).
type FileChange struct {
	Path      string        `json:"path"`
	Kind      Kind          `json:"kind,omitempty"`
	Digest    digest.Digest `json:"digest"`
	Size      int64         `json:"size"`
	OldDigest digest.Digest `json:"oldDigest,omitempty"`
	OldSize   int64         `json:"oldSize,omitempty"`
}

// Diff is what changes from one manifest to another, as a rollout from the first to the second sees it.
type Diff struct {
	Added     []FileChange `json:"added"`
	Removed   []FileChange `json:"removed"`
	Changed   []FileChange `json:"changed"`
	Unchanged int          `json:"unchanged"`
	// ConfigChanged: the config blobs differ (a new model config, or the same files described anew).
	ConfigChanged bool `json:"configChanged"`
	// Fetch are the blobs of the second manifest (config and layers) the first does not have, each once: what a
	// node holding the first must download to hold the second. A file moved to another path, or two files of one
	// content, cost nothing more.
	Fetch      []ocispec.Descriptor `json:"fetch"`
	FetchBytes int64                `json:"fetchBytes"`
	// TotalBytes is the size of the second manifest's blobs, each once: what a node holding nothing downloads.
	TotalBytes int64 `json:"totalBytes"`
}

// DiffManifests compares from and to by path (the layers' org.cncf.model.filepath, its legacy and oras-title
// spellings, as Layers reads them; a layer with none, a container image's, is named by its digest) and by digest
// for the bytes to fetch.
func DiffManifests(from, to ocispec.Manifest) (*Diff, error) {
	old, err := byPath(from)
	if err != nil {
		return nil, err
	}
	cur, err := byPath(to)
	if err != nil {
		return nil, err
	}
	d := &Diff{Added: []FileChange{}, Removed: []FileChange{}, Changed: []FileChange{}, Fetch: []ocispec.Descriptor{},
		ConfigChanged: from.Config.Digest != to.Config.Digest}
	for p, l := range cur {
		o, ok := old[p]
		switch {
		case !ok:
			d.Added = append(d.Added, FileChange{Path: p, Kind: l.Kind, Digest: l.Digest, Size: l.Size})
		case o.Digest != l.Digest:
			d.Changed = append(d.Changed, FileChange{Path: p, Kind: l.Kind, Digest: l.Digest, Size: l.Size, OldDigest: o.Digest, OldSize: o.Size})
		default:
			d.Unchanged++
		}
	}
	for p, o := range old {
		if _, ok := cur[p]; !ok {
			d.Removed = append(d.Removed, FileChange{Path: p, Kind: o.Kind, Digest: o.Digest, Size: o.Size})
		}
	}
	for _, s := range [][]FileChange{d.Added, d.Removed, d.Changed} {
		sort.Slice(s, func(i, j int) bool { return s[i].Path < s[j].Path })
	}
	have := map[digest.Digest]bool{from.Config.Digest: true}
	for _, l := range from.Layers {
		have[l.Digest] = true
	}
	seen := map[digest.Digest]bool{}
	for _, b := range append([]ocispec.Descriptor{to.Config}, to.Layers...) {
		if seen[b.Digest] {
			continue
		}
		seen[b.Digest] = true
		d.TotalBytes += b.Size
		if !have[b.Digest] {
			d.Fetch = append(d.Fetch, b)
			d.FetchBytes += b.Size
		}
	}
	return d, nil
}

// byPath indexes a manifest's layers by the path they place.
func byPath(m ocispec.Manifest) (map[string]Layer, error) {
	ls, err := Layers(m)
	if err != nil {
		return nil, err
	}
	out := make(map[string]Layer, len(ls))
	for _, l := range ls {
		p := l.Path
		if p == "" {
			p = "layer " + l.Digest.String()
		}
		out[p] = l
	}
	return out, nil
}
