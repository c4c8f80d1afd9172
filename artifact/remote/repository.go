package remote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/errcode"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/transfer"
)

// Repository is a repository on a registry, reached directly or through mirrors. It is an oras.Target (and a
// ReferenceFetcher, ReferencePusher, Mounter, PredecessorFinder and TagLister), so oras-go's copy functions use
// it like a remote.Repository: reads (Resolve, Fetch) try the mirrors with the needed capability first and fall back
// to the origin; writes, existence checks and referrers always go to the origin.
type Repository struct {
	// Reference names the origin registry and repository (its Reference field is the tag or digest asked for).
	Reference registry.Reference
	origin    *endpointRepo
	endpoints []*endpointRepo // mirrors in order, then the origin
	opts      Options

	pingOnce sync.Once
	isOCI    bool

	// Which endpoint last served each digest, and those whose bytes of a digest did not match it (Distrust): a
	// mirror that tampers with or truncates a blob is passed over for it, and the read goes on from the next.
	mu         sync.Mutex
	servedBy   map[string]*endpointRepo
	distrusted map[string]map[*endpointRepo]bool
	// demoted endpoints broke off a read of a digest (a dropped connection): the reconnect tries the others
	// first, so a mirror that cuts every transfer short does not hold the read until its attempts run out.
	demoted map[string]map[*endpointRepo]bool
}

type endpointRepo struct {
	endpoint
	repo  *remote.Repository
	blobs *auth.Client // repo's auth without oras-go's retries, for blob reads (see blobReader)
	hc    *http.Client // without auth, for the API-version ping
}

// NewRepository parses ref (registry/repository[:tag|@digest]) and returns the repository and the parsed reference.
func NewRepository(ref string, opts Options) (*Repository, registry.Reference, error) {
	if err := artifact.RefuseCredentials(ref); err != nil {
		return nil, registry.Reference{}, err
	}
	parsed, err := registry.ParseReference(ref)
	if err != nil {
		return nil, registry.Reference{}, fmt.Errorf("invalid reference %q: %w", ref, err)
	}
	eps, err := loadEndpoints(opts, parsed.Registry)
	if err != nil {
		return nil, registry.Reference{}, err
	}
	cred, err := opts.credentialFunc()
	if err != nil {
		return nil, registry.Reference{}, err
	}
	r := &Repository{Reference: parsed, opts: opts}
	cache := auth.NewCache()
	for _, ep := range eps {
		hc, err := httpClient(opts, ep, parsed.Registry, !ep.mirror)
		if err != nil {
			return nil, registry.Reference{}, fmt.Errorf("%s: %w", ep.host, err)
		}
		// Blob reads are retried by the transfer seam alone (see package transfer): their client has no
		// retries of its own, and shares the endpoint's tokens.
		bc, err := httpClient(opts, ep, parsed.Registry, false)
		if err != nil {
			return nil, registry.Reference{}, fmt.Errorf("%s: %w", ep.host, err)
		}
		epRef := parsed
		epRef.Registry = ep.host
		epRef.Reference = ""
		er := &endpointRepo{
			endpoint: ep,
			hc:       hc,
			blobs:    authClient(bc, cred, cache, opts.UserAgent),
			repo: &remote.Repository{
				Client:    authClient(hc, cred, cache, opts.UserAgent),
				Reference: epRef,
				PlainHTTP: ep.scheme == "http",
			},
		}
		r.endpoints = append(r.endpoints, er)
	}
	r.origin = r.endpoints[len(r.endpoints)-1]
	return r, parsed, nil
}

// Origin is the oras-go repository of the origin registry, for operations this type does not wrap.
func (r *Repository) Origin() *remote.Repository { return r.origin.repo }

func (r *Repository) String() string { return r.Reference.Registry + "/" + r.Reference.Repository }

// wrap names the origin registry and repository in err.
func (r *Repository) wrap(subject string, err error) error {
	return wrapErr("", r.Reference.Registry, r.Reference.Repository, subject, r.opts.Hints, err)
}

// readers returns the endpoints that may serve a read of reference (see endpoint.serves), in order, without those
// distrusted for it: healthy mirrors, then demoted ones, then the origin, always last since retries are its alone.
func (r *Repository) readers(reference string) []*endpointRepo {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out, last []*endpointRepo
	for _, ep := range r.endpoints {
		switch {
		case !ep.serves(reference) || r.distrusted[reference][ep]:
		case ep == r.origin:
		case r.demoted[reference][ep]:
			last = append(last, ep)
		default:
			out = append(out, ep)
		}
	}
	out = append(out, last...)
	if r.origin.serves(reference) && !r.distrusted[reference][r.origin] {
		out = append(out, r.origin)
	}
	return out
}

// mark sets m[reference][ep], making the maps as needed; r.mu is held.
func mark(m *map[string]map[*endpointRepo]bool, reference string, ep *endpointRepo) {
	if *m == nil {
		*m = map[string]map[*endpointRepo]bool{}
	}
	if (*m)[reference] == nil {
		(*m)[reference] = map[*endpointRepo]bool{}
	}
	(*m)[reference][ep] = true
}

// brokeOff is a blob body that demotes its endpoint for the digest when the transfer breaks (see demoted).
type brokeOff struct {
	io.ReadCloser
	r         *Repository
	reference string
	ep        *endpointRepo
}

func (b *brokeOff) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF && !errors.Is(err, context.Canceled) {
		b.r.mu.Lock()
		mark(&b.r.demoted, b.reference, b.ep)
		b.r.mu.Unlock()
	}
	return n, err
}

// served records that ep answered a read of reference.
func (r *Repository) served(reference string, ep *endpointRepo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.servedBy == nil {
		r.servedBy = map[string]*endpointRepo{}
	}
	r.servedBy[reference] = ep
}

// Mirrored reports whether reads may be answered by a mirror rather than the origin.
func (r *Repository) Mirrored() bool { return len(r.endpoints) > 1 }

// FromOrigin reports whether the last read of d (a manifest or blob, from any offset) was answered by the origin
// itself. A mirror answers with its own credentials (a P2P agent or a pull-through cache reads the origin with
// the fleet's), so what it served shows nothing of what the origin serves this Repository's caller.
func (r *Repository) FromOrigin(d digest.Digest) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.servedBy[d.String()] == r.origin
}

// Distrust is told that the bytes last read of d did not match it (a digest or size mismatch found by the
// consumer): the endpoint that served them is not asked for d again by this Repository; Distrust names it and
// reports whether another endpoint remains to read d from. A lying mirror or peer costs a refetch from the next endpoint,
// never the pull; the origin is the last, and its bytes failing is the pull's failure.
func (r *Repository) Distrust(d digest.Digest) (endpoint string, more bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ep := r.servedBy[d.String()]
	if ep == nil {
		return "", false
	}
	if ep == r.origin {
		return ep.host, false
	}
	delete(r.servedBy, d.String())
	mark(&r.distrusted, d.String(), ep)
	return ep.host, true
}

// firstOf runs fn on each endpoint in turn, mirrors first, until one succeeds: the one fallback of reads, for
// Repository's endpoints and mirrorTransport's. The last error, the origin's, is the one returned, since a mirror's
// failure is expected (a cache miss) and only the origin's answer is authoritative.
func firstOf[E, T any](ctx context.Context, eps []E, fn func(E) (T, error)) (T, error) {
	var zero T
	var last error = errNoEndpoint
	for _, ep := range eps {
		v, err := fn(ep)
		if err == nil {
			return v, nil
		}
		last = err
		if ctx.Err() != nil {
			return zero, err
		}
	}
	return zero, last
}

// Resolve resolves a tag or digest to the manifest descriptor. Each endpoint must answer within the idle limit, as
// a blob read must start within it: a registry that stalls a tag does not hold its caller, or the callers that
// share its pull, for the longer response-header limit of uploads.
func (r *Repository) Resolve(ctx context.Context, reference string) (ocispec.Descriptor, error) {
	tm := r.opts.Timeouts.orDefault()
	d, err := firstOf(ctx, r.readers(reference), func(ep *endpointRepo) (ocispec.Descriptor, error) {
		stalled := fmt.Errorf("%w: manifest %s: no answer within %s", ErrUnavailable, reference, tm.Idle)
		rctx, cancel := context.WithTimeoutCause(ctx, tm.Idle, stalled)
		defer cancel()
		d, err := ep.repo.Resolve(rctx, reference)
		if err != nil && ctx.Err() == nil && context.Cause(rctx) == stalled {
			err = stalled
		}
		return d, err
	})
	return d, r.manifestErr(ctx, reference, err)
}

type fetched struct {
	desc ocispec.Descriptor
	rc   io.ReadCloser
}

// FetchReference resolves and fetches a manifest in one request.
func (r *Repository) FetchReference(ctx context.Context, reference string) (ocispec.Descriptor, io.ReadCloser, error) {
	f, err := firstOf(ctx, r.readers(reference), func(ep *endpointRepo) (fetched, error) {
		return r.readManifest(ctx, func(ctx context.Context) (ocispec.Descriptor, io.ReadCloser, error) {
			return ep.repo.FetchReference(ctx, reference)
		})
	})
	return f.desc, f.rc, r.manifestErr(ctx, reference, err)
}

// readManifest reads a whole manifest (at most artifact.MaxManifestBytes, checked against its descriptor) within twice the
// idle limit (its answer within one, as a blob read's, and its few megabytes at most within another), so a registry
// that stalls, before or after the headers, holds neither the caller nor the callers sharing its pull for long.
func (r *Repository) readManifest(ctx context.Context, fetch func(context.Context) (ocispec.Descriptor, io.ReadCloser, error)) (fetched, error) {
	tm := r.opts.Timeouts.orDefault()
	stalled := fmt.Errorf("%w: the manifest did not arrive within %s", ErrUnavailable, 2*tm.Idle)
	mctx, cancel := context.WithTimeoutCause(ctx, 2*tm.Idle, stalled)
	defer cancel()
	d, rc, err := fetch(mctx)
	if err != nil {
		if ctx.Err() == nil && context.Cause(mctx) == stalled {
			err = stalled
		}
		return fetched{}, err
	}
	b, err := readManifest(rc, d)
	if err != nil {
		if cause := context.Cause(mctx); cause != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w (%v)", cause, err)
		}
		return fetched{}, err
	}
	return fetched{d, io.NopCloser(bytes.NewReader(b))}, nil
}

// Fetch fetches a manifest or blob. Blob reads resume after a dropped connection (see openBlob).
func (r *Repository) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if isManifest(desc) {
		f, err := firstOf(ctx, r.readers(desc.Digest.String()), func(ep *endpointRepo) (fetched, error) {
			f, err := r.readManifest(ctx, func(ctx context.Context) (ocispec.Descriptor, io.ReadCloser, error) {
				rc, err := ep.repo.Fetch(ctx, desc)
				return desc, rc, err
			})
			if err == nil {
				r.served(desc.Digest.String(), ep)
			}
			return f, err
		})
		return f.rc, r.manifestErr(ctx, desc.Digest.String(), err)
	}
	return r.blobReader(ctx, desc, 0, nil), nil
}

// Exists asks the origin (HEAD) whether it has the manifest or blob.
func (r *Repository) Exists(ctx context.Context, desc ocispec.Descriptor) (bool, error) {
	ok, err := r.origin.repo.Exists(ctx, desc)
	return ok, r.wrap(subjectOf(desc), err)
}

// Push uploads a manifest or blob to the origin.
func (r *Repository) Push(ctx context.Context, desc ocispec.Descriptor, content io.Reader) error {
	return r.wrap(subjectOf(desc), r.origin.repo.Push(ctx, desc, content))
}

// PushReference uploads a manifest and tags it in one request.
func (r *Repository) PushReference(ctx context.Context, desc ocispec.Descriptor, content io.Reader, reference string) error {
	return r.wrap(reference, r.origin.repo.PushReference(ctx, desc, content, reference))
}

// Tag tags a manifest already in the origin.
func (r *Repository) Tag(ctx context.Context, desc ocispec.Descriptor, reference string) error {
	return r.wrap(reference, r.origin.repo.Tag(ctx, desc, reference))
}

// Mount makes a blob of another repository of the same registry available in this one without transferring it,
// falling back to an upload from getContent where the registry cannot mount.
func (r *Repository) Mount(ctx context.Context, desc ocispec.Descriptor, fromRepo string, getContent func() (io.ReadCloser, error)) error {
	return r.origin.repo.Mount(ctx, desc, fromRepo, getContent)
}

// Delete deletes a manifest or blob from the origin.
func (r *Repository) Delete(ctx context.Context, desc ocispec.Descriptor) error {
	return r.wrap(subjectOf(desc), r.origin.repo.Delete(ctx, desc))
}

// Predecessors lists the manifests referring to desc (OCI 1.1 referrers API, or the referrers tag where the
// registry lacks it).
func (r *Repository) Predecessors(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
	d, err := r.origin.repo.Predecessors(ctx, desc)
	return d, r.wrap(subjectOf(desc), err)
}

// Referrers lists the referrers of desc, optionally only those of artifactType.
func (r *Repository) Referrers(ctx context.Context, desc ocispec.Descriptor, artifactType string, fn func([]ocispec.Descriptor) error) error {
	return r.wrap(subjectOf(desc), r.origin.repo.Referrers(ctx, desc, artifactType, fn))
}

// Tags lists the repository's tags.
func (r *Repository) Tags(ctx context.Context, last string, fn func(tags []string) error) error {
	return r.wrap("", r.origin.repo.Tags(ctx, last, fn))
}

// FetchRange opens a blob from offset on (an HTTP Range request), mirrors first. The reader reconnects by itself
// after a dropped connection or a stall, continuing at the byte it stopped at, so start is always offset. It
// delivers desc.Size-offset bytes; verifying them is the caller's job (cas.Ingest does).
func (r *Repository) FetchRange(ctx context.Context, desc ocispec.Descriptor, offset int64) (io.ReadCloser, int64, error) {
	rr := r.blobReader(ctx, desc, offset, nil)
	if err := rr.Connect(); err != nil {
		return nil, 0, err
	}
	return rr, offset, nil
}

// blobReader reads desc from offset through the transfer seam, from the endpoints that serve it (readers): a
// mirror's error moves the read to the next endpoint at once, the origin's are retried under the Options'
// policy. The endpoint each connection is served by is recorded for Distrust; one that breaks off a transfer is
// demoted for the digest, so later reads of it try the others first.
func (r *Repository) blobReader(ctx context.Context, desc ocispec.Descriptor, offset int64, onRead func(int64)) *transfer.Reader {
	ref := desc.Digest.String()
	byName := func() map[string]*endpointRepo {
		m := map[string]*endpointRepo{}
		for _, ep := range r.endpoints {
			m[ep.host] = ep
		}
		return m
	}()
	return r.opts.Timeouts.policy().NewReader(ctx, transfer.Request{
		Digest: desc.Digest, Size: desc.Size, Offset: offset, OnRead: onRead, Retryable: retryable,
		Endpoints: func() []transfer.Endpoint {
			var out []transfer.Endpoint
			for _, ep := range r.readers(ref) {
				out = append(out, transfer.Endpoint{Name: ep.host, Open: func(ctx context.Context, offset int64) (io.ReadCloser, int64, error) {
					rc, start, err := ep.rangeGet(ctx, desc, offset)
					if err != nil {
						if ep == r.origin {
							// The origin's answer is the one a caller hears of; it names the registry.
							err = r.blobErr(ctx, desc, err)
						}
						return nil, 0, err
					}
					return &brokeOff{ReadCloser: rc, r: r, reference: ref, ep: ep}, start, nil
				}})
			}
			return out
		},
		OnServe: func(name string) { r.served(ref, byName[name]) },
		OnPass: func(name string, err error) {
			r.mu.Lock()
			mark(&r.demoted, ref, byName[name])
			r.mu.Unlock()
		},
	})
}

// rangeGet asks for a blob from offset on (the whole blob for offset 0). oras-go's Fetch always starts at 0 (its
// seeker opens a second request), which would send bytes already held; this issues the one Range request directly,
// through the same auth client. A response that declares another size than desc's (Content-Length, the total of
// Content-Range, a range not satisfiable) is ErrSizeMismatch, and so is a body of unknown length that runs past it.
func (ep *endpointRepo) rangeGet(ctx context.Context, desc ocispec.Descriptor, offset int64) (io.ReadCloser, int64, error) {
	ref := ep.repo.Reference
	ref.Reference = desc.Digest.String()
	ctx = auth.AppendRepositoryScope(ctx, ref, auth.ActionPull)
	url := fmt.Sprintf("%s://%s/v2/%s/blobs/%s", ep.scheme, ref.Host(), ref.Repository, desc.Digest)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, 0, err
	}
	if offset > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
	}
	resp, err := ep.blobs.Do(req)
	if err != nil {
		return nil, 0, err
	}
	sizeErr := func(format string, args ...any) (io.ReadCloser, int64, error) {
		resp.Body.Close()
		return nil, 0, fmt.Errorf("GET %s: %w: %s, the descriptor says %d bytes", url, ErrSizeMismatch, fmt.Sprintf(format, args...), desc.Size)
	}
	switch resp.StatusCode {
	case http.StatusPartialContent:
		cr := resp.Header.Get("Content-Range")
		start, total, ok := ParseContentRange(cr)
		if !ok || start != offset {
			resp.Body.Close()
			return nil, 0, fmt.Errorf("GET %s: Content-Range %q does not start at %d", url, cr, offset)
		}
		if total >= 0 && total != desc.Size {
			return sizeErr("the registry's blob is %d bytes (Content-Range %q)", total, cr)
		}
		if resp.ContentLength >= 0 && resp.ContentLength != desc.Size-offset {
			return sizeErr("the range from %d is %d bytes long", offset, resp.ContentLength)
		}
		return exactBody(resp, desc.Size-offset), offset, nil
	case http.StatusOK:
		// The server ignores Range (or none was asked): take the whole blob.
		if resp.ContentLength >= 0 && resp.ContentLength != desc.Size {
			return sizeErr("the registry's blob is %d bytes", resp.ContentLength)
		}
		return exactBody(resp, desc.Size), 0, nil
	case http.StatusRequestedRangeNotSatisfiable:
		return sizeErr("the registry's blob ends before byte %d (Content-Range %q)", offset, resp.Header.Get("Content-Range"))
	case http.StatusNotFound:
		resp.Body.Close()
		return nil, 0, fmt.Errorf("%s: %w", desc.Digest, errdef.ErrNotFound)
	default:
		defer resp.Body.Close()
		return nil, 0, &errcode.ErrorResponse{Method: req.Method, URL: req.URL, StatusCode: resp.StatusCode}
	}
}

// ParseContentRange reads a Content-Range header, "bytes first-last/total" (total -1 when "*"): the one reading
// of it for every source that resumes with a Range request (registries, the Hugging Face Hub).
func ParseContentRange(h string) (first, total int64, ok bool) {
	rest, ok := strings.CutPrefix(h, "bytes ")
	if !ok {
		return 0, 0, false
	}
	rng, size, _ := strings.Cut(rest, "/")
	f, _, ok := strings.Cut(rng, "-")
	if !ok {
		return 0, 0, false
	}
	first, err := strconv.ParseInt(f, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	if first < 0 {
		return 0, 0, false
	}
	total = -1
	if size != "*" {
		if total, err = strconv.ParseInt(size, 10, 64); err != nil || total < 0 {
			return 0, 0, false
		}
	}
	return first, total, true
}

// exactBody returns the body of resp, which must hold want bytes. net/http already fails a body shorter than its
// Content-Length; one of unknown length (chunked) is checked here for running past want.
func exactBody(resp *http.Response, want int64) io.ReadCloser {
	if resp.ContentLength >= 0 {
		return resp.Body
	}
	return &boundedBody{rc: resp.Body, left: want}
}

type boundedBody struct {
	rc   io.ReadCloser
	left int64
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	if b.left == 0 && err == nil {
		// Everything wanted arrived: the stream must end here.
		var one [1]byte
		m, perr := b.rc.Read(one[:])
		if m > 0 {
			return n, fmt.Errorf("%w: the source sends more bytes than the descriptor says", ErrSizeMismatch)
		}
		if perr == io.EOF {
			err = io.EOF
		}
	}
	return n, err
}

func (b *boundedBody) Close() error { return b.rc.Close() }

// manifestErr names a failed manifest read, telling a missing manifest from a server that is no registry at all.
func (r *Repository) manifestErr(ctx context.Context, reference string, err error) error {
	if err == nil {
		return nil
	}
	subject := "manifest " + reference
	if errors.Is(err, errdef.ErrNotFound) && !r.speaksOCI(ctx) {
		redactURLs(err)
		return &Error{Registry: r.Reference.Registry, Repository: r.Reference.Repository, Subject: subject, Kind: ErrNotOCI,
			Err: fmt.Errorf("GET /v2/ does not answer as the distribution API does: %w", err)}
	}
	return r.wrap(subject, err)
}

func (r *Repository) blobErr(ctx context.Context, desc ocispec.Descriptor, err error) error {
	if errors.Is(err, errdef.ErrNotFound) && !r.speaksOCI(ctx) {
		redactURLs(err)
		return &Error{Registry: r.Reference.Registry, Repository: r.Reference.Repository, Subject: subjectOf(desc), Kind: ErrNotOCI,
			Err: fmt.Errorf("GET /v2/ does not answer as the distribution API does: %w", err)}
	}
	return r.wrap(subjectOf(desc), err)
}

// speaksOCI pings the origin's /v2/: a registry answers 200 or 401; a web server that is no registry answers 404.
func (r *Repository) speaksOCI(ctx context.Context) bool {
	r.pingOnce.Do(func() {
		r.isOCI = true
		req, err := http.NewRequestWithContext(ctx, http.MethodGet,
			fmt.Sprintf("%s://%s/v2/", r.origin.scheme, r.origin.repo.Reference.Host()), nil)
		if err != nil {
			return
		}
		resp, err := r.origin.hc.Do(req)
		if err != nil {
			return
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK, http.StatusUnauthorized, http.StatusForbidden:
		default:
			r.isOCI = resp.Header.Get("Docker-Distribution-Api-Version") != ""
		}
	})
	return r.isOCI
}

// subjectOf names a descriptor in errors and progress: its file path if it has one, then its digest.
func subjectOf(desc ocispec.Descriptor) string {
	if desc.Digest == "" {
		return ""
	}
	kind := "blob"
	if isManifest(desc) {
		kind = "manifest"
	}
	if name := descName(desc); name != "" {
		return fmt.Sprintf("%s %s %s", kind, desc.Digest, name)
	}
	return fmt.Sprintf("%s %s", kind, desc.Digest)
}
