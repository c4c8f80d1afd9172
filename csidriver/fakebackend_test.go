package csidriver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	digest "github.com/opencontainers/go-digest"
)

// fakeBackend stands in for the cache and the registry in the package's own tests: references resolve from a
// map, a pull writes a few files, and views are real directories so the mounts are real.
type fakeBackend struct {
	root string

	mu      sync.Mutex
	tags    map[string]digest.Digest // reference → digest ("registry" side)
	pulled  map[digest.Digest]bool
	owners  map[string]string // owner → view dir
	pullErr error
	deny    map[digest.Digest]bool // digests the policy refuses
	// gate, if set, blocks pulls until closed; resolveGate does the same for resolves.
	gate        chan struct{}
	resolveGate chan struct{}
	pulls       atomic.Int32
	// acl makes a name (host/repository) private: only these pull secrets (DockerConfigJSON) may resolve it;
	// forbid lists secrets the registry answers 403. names holds the digests each pushed name serves, checked
	// for names that have any.
	acl      map[string][]string
	forbid   map[string]bool
	names    map[string]map[digest.Digest]bool
	resolves atomic.Int32
	// unreachable hosts fail every resolve with ErrUnavailable.
	unreachable map[string]bool
	// blobless names serve manifests but none of their blobs (Prove fails).
	blobless map[string]bool
	// holds counts the holds not yet released.
	holds atomic.Int32
	// nodeCreds says the node's own credentials hold one for every host.
	nodeCreds bool
}

func newFakeBackend(root string) *fakeBackend {
	return &fakeBackend{root: root, tags: map[string]digest.Digest{}, pulled: map[digest.Digest]bool{}, owners: map[string]string{}}
}

func (f *fakeBackend) push(ref, content string) digest.Digest {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := digest.FromString(content)
	f.tags[ref] = d
	if f.names == nil {
		f.names = map[string]map[digest.Digest]bool{}
	}
	name := nameOf(ref)
	if f.names[name] == nil {
		f.names[name] = map[digest.Digest]bool{}
	}
	f.names[name][d] = true
	return d
}

// nameOf strips the tag or digest off a reference.
func nameOf(ref string) string {
	if i := strings.LastIndex(ref, "@"); i >= 0 {
		return ref[:i]
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i]
	}
	return ref
}

func (f *fakeBackend) VolumeCredential(ctx context.Context, host string, creds Credentials) ([]byte, error) {
	if len(creds.DockerConfigJSON) == 0 {
		return nil, nil
	}
	return creds.DockerConfigJSON, nil
}

func (f *fakeBackend) NodeCredential(ctx context.Context, host string) (bool, error) {
	return f.nodeCreds, nil
}

func (f *fakeBackend) Ready() error { return nil }

func (f *fakeBackend) Resolve(ctx context.Context, ref string, creds Credentials) (digest.Digest, error) {
	if f.resolveGate != nil {
		select {
		case <-f.resolveGate:
		case <-ctx.Done():
			return "", fmt.Errorf("resolve %s: %w", ref, ctx.Err())
		}
	}
	f.resolves.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	name := nameOf(ref)
	if host, _, _ := strings.Cut(name, "/"); f.unreachable[host] {
		return "", fmt.Errorf("%s: no such host: %w", host, ErrUnavailable)
	}
	if allowed, private := f.acl[name]; private {
		switch c := string(creds.DockerConfigJSON); {
		case f.forbid[c]:
			return "", fmt.Errorf("manifest %s: %w", ref, ErrForbidden)
		case !slices.Contains(allowed, c):
			return "", fmt.Errorf("manifest %s: %w", ref, ErrUnauthorized)
		}
	}
	if i := strings.LastIndex(ref, "@"); i >= 0 {
		d, err := digest.Parse(ref[i+1:])
		if err == nil && len(f.names[name]) > 0 && !f.names[name][d] {
			return "", fmt.Errorf("manifest %s: %w", ref, ErrNotFound)
		}
		return d, err
	}
	d, ok := f.tags[ref]
	if !ok {
		return "", fmt.Errorf("manifest %s: %w", ref, ErrNotFound)
	}
	return d, nil
}

func (f *fakeBackend) Local(d digest.Digest) (digest.Digest, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return d, f.pulled[d]
}

func (f *fakeBackend) Pull(ctx context.Context, ref string, d digest.Digest, platform string, creds Credentials, progress func(Progress)) (digest.Digest, error) {
	f.pulls.Add(1)
	progress(Progress{DoneBytes: 0, TotalBytes: 100, TotalLayers: 1})
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pullErr != nil {
		return "", f.pullErr
	}
	dir := filepath.Join(f.root, "content", d.Encoded())
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), []byte(ref), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "config.json"), []byte("{}"), 0o644); err != nil {
		return "", err
	}
	f.pulled[d] = true
	progress(Progress{DoneBytes: 100, TotalBytes: 100, DoneLayers: 1, TotalLayers: 1})
	return d, nil
}

func (f *fakeBackend) Acquire(owner string, d digest.Digest, sel Selector) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.pulled[d] {
		return "", fmt.Errorf("%s: %w", d, ErrNotFound)
	}
	view := filepath.Join(f.root, "content", d.Encoded())
	f.owners[owner] = view
	return view, nil
}

func (f *fakeBackend) Release(owner string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.owners, owner)
	return nil
}

func (f *fakeBackend) Owners(prefix string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for o := range f.owners {
		if strings.HasPrefix(o, prefix) {
			out = append(out, o)
		}
	}
	return out, nil
}

func (f *fakeBackend) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	views := map[string]bool{}
	for _, v := range f.owners {
		views[v] = true
	}
	return Stats{Views: len(views), Refs: len(f.owners)}
}

func (f *fakeBackend) Verify(ctx context.Context, ref string, d digest.Digest, creds Credentials) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.deny[d] {
		return fmt.Errorf("%w: %s is not signed", ErrDenied, d)
	}
	return nil
}

// Prove serves a name's blobs wherever it serves its manifest, unless blobless lists the name.
func (f *fakeBackend) Prove(ctx context.Context, ref string, top, manifest digest.Digest, creds Credentials) error {
	if _, err := f.Resolve(ctx, nameOf(ref)+"@"+top.String(), creds); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.blobless[nameOf(ref)] {
		return fmt.Errorf("blob of %s: %w", manifest, ErrNotFound)
	}
	return nil
}

// Hold counts holds; it fails for content not pulled.
func (f *fakeBackend) Hold(d digest.Digest) (func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.pulled[d] {
		return nil, fmt.Errorf("manifest %s: %w", d, ErrNotFound)
	}
	f.holds.Add(1)
	return func() { f.holds.Add(-1) }, nil
}

// Screen allows everything: the scan policy is tested with the real backend.
func (f *fakeBackend) Screen(context.Context, string, digest.Digest, digest.Digest) error { return nil }
