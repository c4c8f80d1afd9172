// Package cache is a node's content store for model artifacts and container images: it pulls them once, keeps
// every blob once, unpacks every tar layer once and serves read-only directory views that volumes bind-mount.
//
// Layout under Options.Root:
//
//	blobs/sha256/<hex>     verified blobs (package cas): manifests, configs, layers. A raw layer is the file itself.
//	ingest/                resumable partial downloads (cas), kept across restarts
//	layers/sha256/<hex>/   each tar layer extracted once (whiteouts kept as .wh.* marker files)
//	views/<hex>[-<sel>]/   one read-only tree per manifest (and selector), assembled with hardlinks, shared by
//	                       every volume of that manifest
//	tmp/                   views and layers under construction, renamed into place when complete
//	meta.db                bbolt: manifests, references (volumes and pins), last use
//
// The API:
//
//	func Open(opts Options) (*Cache, error)
//	    Options{Root string; MaxBytes int64; Limits archive.Limits; Platform ocispec.Platform; PullLinger, ...}
//	    Opens (creating) the cache and runs crash recovery: half-built views and interrupted extractions are
//	    deleted, complete blobs and views and resumable partial downloads are kept.
//	func (c *Cache) Close() error
//	func (c *Cache) Pull(ctx, src oras.ReadOnlyTarget, desc ocispec.Descriptor, progress func(Progress)) (ocispec.Descriptor, error)
//	    desc is a resolved manifest or index; an index is narrowed to Options.Platform. Returns the manifest
//	    descriptor chosen. Every digest and size is verified; tar layers are extracted; hostile content is refused.
//	    Concurrent Pulls of one digest share one transfer, and a Pull whose ctx ends leaves the transfer running
//	    for Options.PullLinger so that a retry joins it (the CSI deadline pattern). Progress{Total, Done int64}.
//	func (c *Cache) Has(d digest.Digest) bool                    // d is a manifest or an index digest, complete
//	func (c *Cache) Resolve(d digest.Digest) (ocispec.Descriptor, error) // manifest or index digest -> manifest
//	func (c *Cache) Acquire(owner string, manifest digest.Digest, sel Selector) (viewDir string, err error)
//	    Builds the view once per (manifest, selector) and records that owner (a volume id, or "pin:<name>") uses it.
//	    An owner holds one reference; acquiring again with the same arguments is a no-op, with others it moves.
//	func (c *Cache) Release(owner string) error                   // idempotent
//	func (c *Cache) GC(ctx) (GCStats, error)
//	    Evicts whole manifests, least recently used first, until usage is under MaxBytes; never one that a
//	    reference or an in-flight pull uses. Deletes blobs, layers and views no kept manifest needs.
//	func (c *Cache) List() ([]Entry, error)
//	func (c *Cache) Refs() ([]Ref, error)
//	func (c *Cache) Usage() (Usage, error)
//	func (c *Cache) Verify(ctx) (VerifyReport, error)             // re-hashes every blob, checks layers and views
//	func (c *Cache) Remove(manifest digest.Digest) error           // ErrInUse while referenced
//
// Selector{Kinds []artifact.Kind; Include []string} narrows a view to some layer kinds and to files matching
// globs ("*.safetensors", "tokenizer/**"); the zero Selector is the whole artifact.
//
// All state that must survive a crash is either in meta.db (written in transactions) or is a directory renamed
// into place when complete, so the filesystem never holds a half-built view or layer under its final name.
package cache
