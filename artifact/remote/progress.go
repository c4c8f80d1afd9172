package remote

import (
	"sync"
	"time"

	"github.com/modelpack/modelpack/artifact"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Status is what happened to one blob.
type Status string

const (
	StatusTransferred Status = "transferred" // its bytes moved
	StatusExists      Status = "exists"      // the destination had it already (HEAD or a local check)
	StatusMounted     Status = "mounted"     // the registry linked it from another repository
	StatusFailed      Status = "failed"
)

// Reporter receives per-blob progress. Calls for different blobs come from different goroutines; calls for one blob
// are sequential. Start and Update carry the bytes of the blob done so far (a resumed transfer starts above 0; a
// restarted upload goes back to 0).
type Reporter interface {
	Start(desc ocispec.Descriptor, done int64)
	Update(desc ocispec.Descriptor, done int64)
	Finish(desc ocispec.Descriptor, status Status, err error)
}

// BlobResult is the outcome of one blob.
type BlobResult struct {
	Digest    digest.Digest `json:"digest"`
	MediaType string        `json:"mediaType"`
	Size      int64         `json:"size"`
	Name      string        `json:"name,omitempty"`
	Status    Status        `json:"status"`
	// Transferred is the bytes of it that crossed the network (less than Size when resumed, more after retries).
	Transferred int64 `json:"transferredBytes"`
}

// Result summarises a push, pull, copy or fetch.
type Result struct {
	Reference  string             `json:"reference"`
	Descriptor ocispec.Descriptor `json:"descriptor"`
	Blobs      []BlobResult       `json:"blobs"`
	// Transferred is the layer and config bytes that crossed the network, manifests aside.
	Transferred int64    `json:"transferredBytes"`
	Seconds     float64  `json:"seconds"`
	Files       []string `json:"files,omitempty"` // fetch: the paths written, relative to the directory
}

// tracker records blob outcomes and forwards progress to the reporter.
type tracker struct {
	rep   Reporter
	mu    sync.Mutex
	blobs map[digest.Digest]*BlobResult
	order []digest.Digest
	start time.Time
}

func newTracker(rep Reporter) *tracker {
	return &tracker{rep: rep, blobs: map[digest.Digest]*BlobResult{}, start: time.Now()}
}

func (t *tracker) entry(desc ocispec.Descriptor) *BlobResult {
	b, ok := t.blobs[desc.Digest]
	if !ok {
		b = &BlobResult{Digest: desc.Digest, MediaType: desc.MediaType, Size: desc.Size, Name: descName(desc)}
		t.blobs[desc.Digest] = b
		t.order = append(t.order, desc.Digest)
	}
	return b
}

// meter starts tracking one blob's transfer, of which done bytes are already held.
func (t *tracker) meter(desc ocispec.Descriptor, done int64) *meter {
	t.mu.Lock()
	t.entry(desc)
	t.mu.Unlock()
	if t.rep != nil {
		t.rep.Start(desc, done)
	}
	return &meter{t: t, desc: desc, done: done}
}

func (t *tracker) finish(desc ocispec.Descriptor, status Status, err error) {
	t.mu.Lock()
	t.entry(desc).Status = status
	t.mu.Unlock()
	if t.rep != nil {
		t.rep.Finish(desc, status, err)
	}
}

func (t *tracker) result(ref string, root ocispec.Descriptor) *Result {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := &Result{Reference: ref, Descriptor: root, Blobs: []BlobResult{}, Seconds: time.Since(t.start).Seconds()}
	for _, d := range t.order {
		b := *t.blobs[d]
		r.Blobs = append(r.Blobs, b)
		r.Transferred += b.Transferred
	}
	return r
}

// meter counts one blob's bytes.
type meter struct {
	t    *tracker
	desc ocispec.Descriptor
	done int64
}

func (m *meter) add(n int64) {
	m.done += n
	m.t.mu.Lock()
	m.t.entry(m.desc).Transferred += n
	m.t.mu.Unlock()
	if m.t.rep != nil {
		m.t.rep.Update(m.desc, m.done)
	}
}

// rewind restarts the count for a new upload attempt; the bytes already sent stay counted as transferred.
func (m *meter) rewind() {
	if m.done == 0 {
		return
	}
	m.done = 0
	if m.t.rep != nil {
		m.t.rep.Update(m.desc, 0)
	}
}

// descName is the file a layer holds, if it says.
func descName(desc ocispec.Descriptor) string {
	return artifact.LayerFilepath(desc.Annotations)
}

// isManifest reports whether desc is a manifest or index (which oras-go copies itself) rather than a blob.
func isManifest(desc ocispec.Descriptor) bool {
	return artifact.IsManifest(desc.MediaType) || artifact.IsIndex(desc.MediaType) || desc.MediaType == "application/vnd.oci.artifact.manifest.v1+json"
}

// seek restarts the count of a resumed upload at offset, the bytes the registry already holds.
func (m *meter) seek(offset int64) {
	m.done = offset
	if m.t.rep != nil {
		m.t.rep.Update(m.desc, offset)
	}
}
