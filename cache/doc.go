// Package cache is a node's content store for model artifacts and container images: it pulls them once, keeps
// every blob once, unpacks every tar layer once and serves read-only directory views that volumes bind-mount.
//
// Layout under Options.Root:
//
//	blobs/sha256/<hex>     verified blobs (package cas): manifests, configs, layers. A raw layer is the file itself.
//	ingest/                resumable partial downloads (cas), kept across restarts until abandoned for PullLinger;
//	                       ingest/durable/ marks the blobs whose flush to disk completed, ingest/boot-id the boot,
//	                       ingest/stamps/ what identifies each blob's verified bytes on disk (cas/stamp.go)
//	quarantine/            damaged blobs taken out of use, kept for inspection until the next GC
//	running                exists while a process has the cache open (its absence at Open means a clean Close)
//	layers/sha256/<hex>/   each tar layer extracted once (whiteouts kept as .wh.* marker files for the merge)
//	views/<hex>[-<sel>]/   one read-only tree per manifest (and selector), assembled with hardlinks, shared by
//	                       every volume of that manifest
//	tmp/, trash/           trees being built or deleted; emptied at Open
//	meta.db                bbolt (schema version 1, internal/schema): manifests, their state and last use, the
//	                       index→manifest choices, references, each blob's scan report, extracted layers' stamps
//	holds/<boot id>.db     bbolt (schema version 1), never flushed: the references of volatile owners (mounts)
//	                       taken in this boot
//
// The API:
//
//	func Open(opts Options) (*Cache, error)
//	    Options{Root; MaxBytes; HighWatermark; LowWatermark; Limits archive.Limits; Platform; Concurrency;
//	    PullLinger; MinAge; FlushDelay; LockTimeout; VerifyInterval; ScrubRate; Logger; VolatileOwnerPrefix}.
//	    Opens (creating) the cache and runs crash recovery: half-built views and layers are deleted, complete
//	    blobs and views and resumable partial downloads are kept. One process holds a root at a time.
//	func (c *Cache) Close() error
//	func (c *Cache) Pull(ctx, src oras.ReadOnlyTarget, desc ocispec.Descriptor, progress func(Progress)) (ocispec.Descriptor, error)
//	    desc is a resolved manifest or index (OCI or Docker v2); an index is narrowed to desc.Platform if set (the
//	    index is then fetched once and not recorded), else to Options.Platform. Returns
//	    the manifest descriptor chosen. Every digest and size is verified, tar layers are extracted, hostile
//	    content is refused. Concurrent Pulls of one digest share one transfer; a Pull whose ctx ends returns, and
//	    the transfer goes on for Options.PullLinger so that a retry joins it (the CSI deadline pattern). A partial
//	    blob resumes with an HTTP Range (a RangeFetcher such as artifact/remote's Repository) or a seek.
//	    Progress{Total, Done int64}; callbacks are serialised and never run after their Pull returned. Blobs the
//	    cache already held are handed to a caller only when its own src serves them (HEADs; see Prove).
//	func (c *Cache) Prove(ctx, src, top, manifest digest.Digest) error   // src serves every part, fetching none
//	func (c *Cache) Hold(d digest.Digest) (manifest digest.Digest, release func(), err error) // kept from GC
//	func (c *Cache) Scan(d digest.Digest) ([]ScannedLayer, error)        // each layer's scan report, once per blob
//	func (c *Cache) Has(d digest.Digest) bool                            // a complete manifest, or index -> manifest
//	func (c *Cache) Resolve(d digest.Digest) (ocispec.Descriptor, error) // manifest or index digest -> manifest
//	func (c *Cache) Acquire(owner string, manifest digest.Digest, sel Selector) (viewDir string, err error)
//	    Builds the view once per (manifest, selector) and records that owner (a volume id, or "pin:<name>") uses
//	    it. An owner holds one reference: acquiring again with the same arguments is a no-op, with others it moves.
//	    ErrNotFound if the manifest is not (completely) in the cache.
//	func (c *Cache) Release(owner string) error                          // idempotent
//	func (c *Cache) GC(ctx) (GCStats, error)
//	    Evicts whole manifests, least recently used first, until usage is under MaxBytes and, once the file system
//	    is HighWatermark percent used (statfs), until it would be LowWatermark percent used (the lower target
//	    wins; watermark.go); never one a reference
//	    or a running pull or a Hold uses, or one used within MinAge. Deletes blobs, layers, views and partials no kept
//	    manifest needs, and selector views nothing references. Safe concurrently with Pull and Acquire.
//	func (c *Cache) Remove(d digest.Digest) error                        // ErrInUse while referenced or pulling
//	func (c *Cache) List() ([]Entry, error)
//	func (c *Cache) Refs() ([]Ref, error)
//	func (c *Cache) Usage() (Usage, error)
//	func (c *Cache) Verify(ctx) (VerifyReport, error)                    // re-hashes every blob; reports, no repair
//	func (c *Cache) Repair(ctx) (VerifyReport, error)                    // Verify, then quarantine what is bad
//	func (c *Cache) Collector() prometheus.Collector                     // metrics, for the caller to register
//	func (c *Cache) Root() string; func (c *Cache) Blobs() *cas.Store
//
// Selector{Kinds []artifact.Kind; Include []string} narrows a view to some layer kinds and to files matching
// globs ("*.safetensors", "tokenizer/**"); the zero Selector is the whole artifact.
//
// Errors: ErrNotFound, ErrInUse, ErrTooLarge (manifest or config over artifact's document limits, a layer over
// archive.Limits), ErrUnsupported (media types, schema 1, escaping file paths), ErrSizeMismatch and
// ErrDigestMismatch (= cas's), and archive.ErrUnsafePath, ErrLinkEscape, ErrSpecialFile from layer extraction.
//
// Crash safety: metadata is written in bbolt transactions; a view or layer directory appears under its final name
// only by rename once complete; GC commits metadata before it deletes files, and unlinks blobs after releasing
// the lock that orders pulls and publishes, each only if no pull needed it again meanwhile (reaper.go). A SIGKILL at any point leaves a cache
// that Open recovers, and a pull that resumes where it stopped. Blobs are named as soon as they are verified and
// flushed to disk in the background (cas): a process crash loses nothing (the page cache holds them), and after a
// restart of the machine Open re-hashes every blob whose flush had not completed before anything can use it.
// Extracted layers are flushed the same way, those extracted close together by one syncfs, and marked durable in
// bucketDurableLayers only after a syncfs that began once their extraction was complete; after a restart of the
// machine an unmarked layer is deleted and extracted again. References of volatile owners (Options.
// VolatileOwnerPrefix: the CSI driver's, each standing for a bind mount) are the exception to durable metadata:
// they are committed to holds/<boot id>.db without a flush, survive a killed process (the page cache has them),
// and are dropped at the first Open after a restart of the machine, which took the mounts with it (kubelet then
// publishes, and so acquires, again). Their Acquire only reads meta.db, so a warm publish waits for no flush behind
// a pull's write-back; the last use it records there is copied into meta.db by GC (holds.go).
//
// Integrity (integrity.go, and cas's stamps): every Has, Resolve, Pull and Acquire stats every blob of the
// manifest and compares it with the stamp recorded when its bytes were last verified (inode, size, mtime, ctime);
// a blob whose stamp changed, or every blob after an unclean start, is re-hashed before it is passed. Every
// Acquire also stats the files of the extracted layers its view uses (layerstamps.go): a changed one has its layer
// deleted with its views and extracted again. A scrub
// re-hashes every blob in the background (idle I/O priority, nice 19, Options.ScrubRate) after an unclean start
// and every VerifyInterval; Repair does it at once. A bad blob is quarantined, its manifests become incomplete
// (the next Pull fetches it again), its views and extracted layers are deleted, and it is counted in
// modelpack_cache_corrupt_blobs_total{problem} and logged.
package cache
