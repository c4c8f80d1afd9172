package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/errcode"

	"github.com/modelpack/modelpack/transfer"
)

// resumableMin is the size above which a blob's upload session (POST, then one PUT streaming the blob and
// committing it, as oras-go sends a blob) is remembered, so that a push cut off part way continues from the bytes
// the registry holds. Smaller blobs go through oras-go: resending one costs less than remembering its session.
//
// The blob goes in one request, not in chunks: a registry with basic auth checks the password (bcrypt) on every
// request, and one request per 8 MiB made pushes to distribution with htpasswd 2.4x slower than oras's.
const resumableMin = 8 << 20

// UploadSessions remembers the registry's upload session (its Location URL) of each blob a push was sending, so that
// a push run again after an interruption asks the registry how far the session got (GET, Range header) and sends
// only the rest. It is a hint: lost, stale or expired on the registry, the blob is sent from the start.
type UploadSessions interface {
	UploadSession(registry, repo string, d digest.Digest) string
	// RecordUploadSession remembers location; "" forgets the blob's session.
	RecordUploadSession(registry, repo string, d digest.Digest, location string) error
}

// resumableUpload is one blob's resumable upload to the origin registry.
type resumableUpload struct {
	r        *Repository
	desc     ocispec.Descriptor
	sessions UploadSessions
	loc      string
	// refused is the offset from which the registry last refused the rest of the blob (416): asked again, a session that still
	// says it holds that much is not where it says, and a new one is started.
	refused int64
}

// errSessionMoved is an upload the registry refused because its session does not hold what it said (416): another
// writer, or the rest of a cut request landing late. The next attempt asks the session again.
var errSessionMoved = errors.New("the upload session does not hold the bytes it reported")

// errResumedCorrupt is a resumed upload whose commit the registry refused: the bytes it kept from an earlier
// request are not the blob's. The next attempt starts a new session.
var errResumedCorrupt = errors.New("the registry refused the digest of a resumed upload")

func (u *resumableUpload) remember(loc string) {
	u.loc = loc
	// A hint: failing to keep it costs the next run a full upload, never this one.
	_ = u.sessions.RecordUploadSession(u.r.Reference.Registry, u.r.Reference.Repository, u.desc.Digest, loc)
}

func (u *resumableUpload) do(ctx context.Context, method, loc string, body io.Reader, n int64, hdr map[string]string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, loc, body)
	if err != nil {
		return nil, err
	}
	req.ContentLength = n
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	ctx = auth.AppendRepositoryScope(ctx, u.r.origin.repo.Reference, auth.ActionPull, auth.ActionPush)
	return u.r.origin.repo.Client.Do(req.WithContext(ctx))
}

// location is the absolute URL of resp's Location header.
func location(resp *http.Response) (string, error) {
	l := resp.Header.Get("Location")
	if l == "" {
		return "", fmt.Errorf("%s %s: the registry gave no upload location", resp.Request.Method, resp.Request.URL.Redacted())
	}
	u, err := resp.Request.URL.Parse(l)
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// responseError is the registry's error of an unexpected response, classified as oras-go's are.
func responseError(resp *http.Response) error {
	e := &errcode.ErrorResponse{Method: resp.Request.Method, URL: resp.Request.URL, StatusCode: resp.StatusCode}
	var body struct{ Errors errcode.Errors }
	if json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&body) == nil {
		e.Errors = body.Errors
	}
	return e
}

// resume asks the remembered session how many bytes the registry holds; 0 with no session when it is gone. A
// failure to ask keeps the session for the next attempt.
func (u *resumableUpload) resume(ctx context.Context) (int64, error) {
	if u.loc == "" {
		return 0, nil
	}
	resp, err := u.do(ctx, http.MethodGet, u.loc, nil, 0, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		// The registry is in trouble, not the session: ask again on the next attempt.
		return 0, responseError(resp)
	}
	held, ok := parseUploadRange(resp.Header.Get("Range"))
	loc, lerr := location(resp)
	if resp.StatusCode != http.StatusNoContent || !ok || lerr != nil || held > u.desc.Size {
		// Expired (404) or unusable (416: the session moved past what it acknowledged): start over.
		if resp.StatusCode != http.StatusNotFound {
			u.cancel(ctx)
		}
		u.loc = ""
		return 0, nil
	}
	if u.refused >= 0 && held == u.refused {
		u.cancel(ctx)
		u.loc, u.refused = "", -1
		return 0, nil
	}
	u.loc = loc
	return held, nil
}

// parseUploadRange reads an upload session's Range header ("0-LAST") as the number of bytes the registry holds.
// "0-0" is both an empty session and one holding a byte (distribution says it for both): it counts as empty, and
// a session that does hold the byte refuses the restart from 0, which then starts a new one.
func parseUploadRange(h string) (int64, bool) {
	first, last, ok := strings.Cut(strings.TrimPrefix(h, "bytes="), "-")
	if !ok || first != "0" {
		return 0, false
	}
	n, err := strconv.ParseInt(last, 10, 64)
	if err != nil || n < 0 || n == math.MaxInt64 {
		return 0, false
	}
	if n == 0 {
		return 0, true
	}
	return n + 1, true
}

// send uploads desc from the byte the session holds on and commits it, in one PUT streaming the rest from open (as
// oras-go sends a blob: POST, then the PUT with the body; a resumed upload's PUT says where its body starts,
// Content-Range). open reads the blob from a given byte. An interruption cuts the PUT off: a registry keeps what it
// received (distribution does), and the next attempt or run asks the session how much that is.
func (u *resumableUpload) send(ctx context.Context, open func(ctx context.Context, offset int64) (io.ReadCloser, error), m *meter) error {
	offset, err := u.resume(ctx)
	if err != nil {
		return err
	}
	// A fresh session holds nothing; a remembered one says where the body starts, which the registry checks
	// (a session whose "0-0" meant one byte refuses a body from 0).
	fresh := u.loc == ""
	if fresh {
		offset = 0
		ep := u.r.origin
		start := fmt.Sprintf("%s://%s/v2/%s/blobs/uploads/", ep.scheme, ep.host, u.r.Reference.Repository)
		resp, err := u.do(ctx, http.MethodPost, start, nil, 0, nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return responseError(resp)
		}
		loc, err := location(resp)
		if err != nil {
			return err
		}
		u.remember(loc)
	}
	commit, err := url.Parse(u.loc)
	if err != nil {
		return err
	}
	q := commit.Query()
	q.Set("digest", u.desc.Digest.String())
	commit.RawQuery = q.Encode()

	n := u.desc.Size - offset
	pctx, cancel := context.WithTimeout(ctx, transfer.AttemptTimeout(n))
	defer cancel()
	m.seek(offset)
	hdr := map[string]string{"Content-Type": "application/octet-stream"}
	var body *fencedReader
	if n > 0 {
		rc, err := open(pctx, offset)
		if err != nil {
			return err
		}
		defer rc.Close()
		body = &fencedReader{r: &countingReader{r: io.LimitReader(rc, n), fn: m.add}}
		if !fresh {
			hdr["Content-Range"] = fmt.Sprintf("%d-%d", offset, u.desc.Size-1)
		}
	}
	var rd io.Reader
	if body != nil {
		rd = body
	}
	resp, err := u.do(pctx, http.MethodPut, commit.String(), rd, n, hdr)
	if body != nil {
		body.fence()
	}
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusCreated:
		u.remember("")
		return nil
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		u.refused = offset
		return fmt.Errorf("%w: %w", errSessionMoved, responseError(resp))
	case !fresh && resp.StatusCode == http.StatusBadRequest:
		u.cancel(ctx)
		return fmt.Errorf("%w: %w", errResumedCorrupt, responseError(resp))
	}
	return responseError(resp)
}

// cancel ends the session on the registry (DELETE), so a push that will not resume leaves no upload behind.
func (u *resumableUpload) cancel(ctx context.Context) {
	if u.loc == "" {
		return
	}
	ctx = context.WithoutCancel(ctx)
	loc := u.loc
	// The location names the session as it was when the upload began; distribution refuses it (416) once the
	// session holds more. Its status gives the current one.
	if resp, err := u.do(ctx, http.MethodGet, loc, nil, 0, nil); err == nil {
		if l, err := location(resp); err == nil && resp.StatusCode == http.StatusNoContent {
			loc = l
		}
		resp.Body.Close()
	}
	if resp, err := u.do(ctx, http.MethodDelete, loc, nil, 0, nil); err == nil {
		resp.Body.Close()
	}
	u.remember("")
}

// fencedReader stops reading its source once fenced. net/http may go on reading a request body after Do returned
// (an early response, an error), while the meter and the next attempt read on.
type fencedReader struct {
	mu     sync.Mutex
	r      io.Reader
	fenced bool
}

func (f *fencedReader) Read(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fenced {
		return 0, errors.New("request body read after its request ended")
	}
	return f.r.Read(p)
}

func (f *fencedReader) fence() {
	f.mu.Lock()
	f.fenced = true
	f.mu.Unlock()
}

// pushResumable uploads a blob through a session remembered in sessions, continuing a session an earlier
// run left and retrying transient failures from the byte the registry holds. A failure that is not an interruption
// cancels the session.
func (r *Repository) pushResumable(ctx context.Context, desc ocispec.Descriptor, open func(ctx context.Context, offset int64) (io.ReadCloser, error), m *meter, sessions UploadSessions) error {
	u := &resumableUpload{r: r, desc: desc, sessions: sessions, loc: sessions.UploadSession(r.Reference.Registry, r.Reference.Repository, desc.Digest)}
	p := r.opts.Timeouts.policy()
	for attempt := 1; ; attempt++ {
		err := u.send(ctx, open, m)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		again := retryable(err) || errors.Is(err, errSessionMoved) || errors.Is(err, errResumedCorrupt)
		if !again || attempt >= p.PushAttempts {
			u.cancel(ctx)
			return r.wrap(subjectOf(desc), err)
		}
		if err := p.Sleep(ctx, p.Backoff(attempt)); err != nil {
			return err
		}
	}
}
