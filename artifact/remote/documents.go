package remote

import (
	"bytes"
	"io"
	"net/http"
	"strings"

	"github.com/modelpack/modelpack/artifact"
)

// limitDocuments wraps a registry transport so that no manifest, index, referrers list or signature manifest over
// artifact's document limits reaches its client, whichever client it is (oras-go here, go-containerregistry in
// signing, which would otherwise read up to 100 MiB): a declared Content-Length over the limit is refused before
// a byte of the body is read, a body that runs past it is cut at the limit, and one that nests or lists past the
// limits is refused before the client decodes it. Blobs pass untouched.
func limitDocuments(next http.RoundTripper) http.RoundTripper { return documentLimit{next} }

type documentLimit struct{ next http.RoundTripper }

func (t documentLimit) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || req.Method != http.MethodGet || resp.StatusCode/100 != 2 || !isDocumentPath(req.URL.Path) {
		return resp, err
	}
	what := "registry document " + req.URL.Redacted()
	b, err := artifact.ReadDocument(resp.Body, resp.ContentLength, what)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	return resp, nil
}

// isDocumentPath reports the registry API paths that answer with a document: /v2/<name>/manifests/<ref> and
// /v2/<name>/referrers/<digest>.
func isDocumentPath(p string) bool {
	if _, kind, _, ok := parseReadPath(p); ok {
		return kind == "manifests"
	}
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		return false
	}
	i := strings.LastIndex(rest, "/referrers/")
	return i > 0 && !strings.Contains(rest[i+len("/referrers/"):], "/")
}
