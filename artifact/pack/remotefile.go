package pack

import (
	"context"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/cas"
)

// RemoteFile is a file of the model whose bytes are elsewhere (a file on the Hugging Face Hub) and are read only
// when its layer is written, so a weight never needs a local copy. Its source states its digest and size, and its
// bytes are checked against them before anything names them.
type RemoteFile struct {
	Path   string        // model-relative, slash-separated
	Size   int64         // bytes
	Digest digest.Digest // what the source states the bytes hash to (sha256)
	// Open reads the file from offset. It returns the offset its stream really starts at: offset, or 0 for a source
	// that can only start over.
	Open func(ctx context.Context, offset int64) (rc io.ReadCloser, start int64, err error)
}

// StatedSink is implemented by sinks that can take a blob whose digest and size are known before it is read (desc
// carries them): they skip one they hold, may resume one cut short, and refuse bytes that do not match. The sink
// owns that check (cas.Verifier): open's reader is not checked, so each byte is hashed once.
type StatedSink interface {
	AddStatedBlob(ctx context.Context, desc ocispec.Descriptor, open func(ctx context.Context, offset int64) (io.ReadCloser, int64, error)) (ocispec.Descriptor, error)
}

// addRemote merges remote files into the nodes walked from the directory, in the walk's order (parents first,
// names in byte order component by component), adding the directories that lead to them.
func addRemote(name func(rel string) string, nodes []node, remote []RemoteFile) ([]node, error) {
	if len(remote) == 0 {
		return nodes, nil
	}
	have := map[string]bool{}
	for _, n := range nodes {
		have[n.rel] = true
	}
	for i := range remote {
		r := &remote[i]
		if !isCleanRel(r.Path) {
			return nil, badInput(name(r.Path), "not a clean relative path inside the model")
		}
		if err := r.Digest.Validate(); err != nil || r.Size < 0 {
			return nil, badInput(name(r.Path), "invalid stated digest %q or size %d", r.Digest, r.Size)
		}
		if have[r.Path] {
			return nil, badInput(name(r.Path), "duplicate layer path")
		}
		have[r.Path] = true
		for d := path.Dir(r.Path); d != "."; d = path.Dir(d) {
			if !have[d] {
				have[d] = true
				nodes = append(nodes, node{rel: d, mode: 0o755, dir: true})
			}
		}
		nodes = append(nodes, node{rel: r.Path, src: r.Path, mode: 0o644, size: r.Size, remote: r})
	}
	sort.SliceStable(nodes, func(a, b int) bool { return walkLess(nodes[a].rel, nodes[b].rel) })
	return nodes, nil
}

// isCleanRel reports whether p is a slash-separated relative path with no empty, ".", ".." or hidden component
// (hidden entries are left out of a directory's walk too).
func isCleanRel(p string) bool {
	if p == "" {
		return false
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || strings.HasPrefix(c, ".") || strings.ContainsRune(c, 0) {
			return false
		}
	}
	return true
}

// walkLess orders paths as filepath.WalkDir visits them.
func walkLess(a, b string) bool {
	as, bs := strings.Split(a, "/"), strings.Split(b, "/")
	for i := 0; i < len(as) && i < len(bs); i++ {
		if as[i] != bs[i] {
			return as[i] < bs[i]
		}
	}
	return len(as) < len(bs)
}

// open reads a node's bytes: a local file, checked against what the walk saw, or a remote file from its
// first byte, checked against its stated size and digest before the consumer can name them.
func (n node) open(ctx context.Context, progress Progress) (io.ReadCloser, error) {
	if n.remote == nil {
		// From the tree's descriptor through no link, and only the file the walk listed (package beneath).
		f, err := n.tree.root.Open(n.src)
		if err != nil {
			return nil, fmt.Errorf("cannot open it again as listed: %w", unwrapPathError(err))
		}
		if err := f.Same(n.stat); err != nil {
			f.Close()
			return nil, unwrapPathError(err)
		}
		return &checkedFile{f: f, want: n.size, progress: progress}, nil
	}
	rc, start, err := n.remote.Open(ctx, 0)
	if err != nil {
		return nil, err
	}
	if start != 0 {
		rc.Close()
		return nil, fmt.Errorf("source of %s started at byte %d, not 0", n.rel, start)
	}
	return readCloser{cas.NewVerifier(n.remote.Digest, n.remote.Size).Reader(&countingReader{rc: rc, progress: progress}), rc}, nil
}
