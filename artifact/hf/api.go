package hf

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/modelpack/modelpack/artifact/remote"
)

// ModelInfo is what the Hub says of a model at a revision (GET /api/models/{repo}/revision/{rev}).
type ModelInfo struct {
	SHA         string    `json:"sha"`
	LibraryName string    `json:"library_name"`
	Gated       any       `json:"gated"`
	Private     bool      `json:"private"`
	CardData    *CardData `json:"cardData"`
}

// CardData is the part of a model card's YAML header that describes the model.
type CardData struct {
	License     stringList `json:"license"`
	LicenseName string     `json:"license_name"`
	LibraryName string     `json:"library_name"`
	BaseModel   stringList `json:"base_model"`
	Datasets    stringList `json:"datasets"`
}

// stringList is a card field given as one string or a list of them.
type stringList []string

func (s *stringList) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		if one != "" {
			*s = []string{one}
		}
		return nil
	}
	var many []any
	if err := json.Unmarshal(b, &many); err != nil {
		return nil // a card field of another shape says nothing we use
	}
	for _, v := range many {
		if str, ok := v.(string); ok && str != "" {
			*s = append(*s, str)
		}
	}
	return nil
}

// Entry is one item of a repository's tree (GET /api/models/{repo}/tree/{rev}?recursive=true).
type Entry struct {
	Type string `json:"type"` // "file" or "directory"
	Path string `json:"path"`
	Size int64  `json:"size"`
	OID  string `json:"oid"` // git blob id (sha1) of the file, or of its LFS pointer
	LFS  *struct {
		OID  string `json:"oid"` // sha256 of the file's bytes
		Size int64  `json:"size"`
	} `json:"lfs"`
}

// apiURL is the API's URL of kind (revision, tree, commits) of repo at rev: /api/models/ORG/NAME/…, or
// /api/datasets/ORG/NAME/… for a dataset (repo datasets/ORG/NAME).
func (c *Client) apiURL(repo, kind, rev string) string {
	api := "/api/models/"
	if id, ok := strings.CutPrefix(repo, datasetPrefix); ok {
		api, repo = "/api/datasets/", id
	}
	return c.Endpoint() + api + repo + "/" + kind + "/" + url.PathEscape(rev)
}

func (c *Client) getJSON(ctx context.Context, rawURL, what string, v any) (*http.Response, error) {
	resp, err := c.do(ctx, http.MethodGet, rawURL, what, http.Header{"Accept": {"application/json"}}, nil)
	if err != nil {
		return nil, err
	}
	b, err := c.readDocument(resp, 64<<20, what)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return nil, fmt.Errorf("%s: the Hub's answer is not the JSON expected: %w", what, err)
	}
	return resp, nil
}

// readDocument reads and closes the body of an API answer: at most limit bytes, all of them within four times
// the idle limit, so that a Hub trickling a byte now and then cannot hold a pack for ever either.
func (c *Client) readDocument(resp *http.Response, limit int64, what string) ([]byte, error) {
	var late atomic.Bool
	deadline := 4 * c.idle
	t := time.AfterFunc(deadline, func() {
		late.Store(true)
		resp.Body.Close()
	})
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	t.Stop()
	resp.Body.Close()
	switch {
	case late.Load():
		return nil, fmt.Errorf("%w: %s: the Hub's answer did not arrive within %s", errUnavailable, what, deadline)
	case err != nil:
		return nil, fmt.Errorf("%w: %s: %w", errUnavailable, what, err)
	case int64(len(b)) > limit:
		return nil, fmt.Errorf("%s: the Hub's answer is larger than %d MiB", what, limit>>20)
	}
	return b, nil
}

// Info resolves ref's revision to its commit and reads what the Hub says of the model there.
func (c *Client) Info(ctx context.Context, ref Ref) (*ModelInfo, error) {
	var info ModelInfo
	if _, err := c.getJSON(ctx, c.apiURL(ref.Repo, "revision", ref.Revision), ref.String(), &info); err != nil {
		return nil, err
	}
	if !isHex(info.SHA, 40) {
		return nil, fmt.Errorf("%s: the Hub gave no commit for the revision (sha %q)", ref, info.SHA)
	}
	return &info, nil
}

// CommitDate is the date of commit in repo: the first commit the history from it lists.
func (c *Client) CommitDate(ctx context.Context, repo, commit string) (time.Time, error) {
	var commits []struct {
		ID   string    `json:"id"`
		Date time.Time `json:"date"`
	}
	what := Scheme + repo + "@" + commit + " (commit history)"
	if _, err := c.getJSON(ctx, c.apiURL(repo, "commits", commit), what, &commits); err != nil {
		return time.Time{}, err
	}
	if len(commits) == 0 || commits[0].ID != commit {
		return time.Time{}, fmt.Errorf("%s: the history does not start at the commit", what)
	}
	return commits[0].Date.UTC(), nil
}

// maxTreeEntries bounds a repository's listing (files and directories): the Hub's largest model repositories hold
// tens of thousands, and a listing without end would otherwise be held in memory page after page.
var maxTreeEntries = 200_000

// Tree lists every file of repo at commit, following the pages the Hub splits it into (Link: rel="next").
func (c *Client) Tree(ctx context.Context, repo, commit string) ([]Entry, error) {
	next := c.apiURL(repo, "tree", commit) + "?recursive=true&expand=false"
	what := Scheme + repo + "@" + commit + " (file list)"
	var all []Entry
	for page := 0; next != ""; page++ {
		if page > 10000 {
			return nil, fmt.Errorf("%s: more than 10000 pages", what)
		}
		resp, err := c.do(ctx, http.MethodGet, next, what, http.Header{"Accept": {"application/json"}}, nil)
		if err != nil {
			return nil, err
		}
		b, err := c.readDocument(resp, 64<<20, what)
		if err != nil {
			return nil, err
		}
		entries, err := ParseTree(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if len(all)+len(entries) > maxTreeEntries {
			return nil, fmt.Errorf("%s: more than %d files and directories; not a model this importer takes", what, maxTreeEntries)
		}
		all = append(all, entries...)
		next = nextLink(resp.Header.Values("Link"), resp.Request.URL)
		if next != "" {
			u, _ := url.Parse(next)
			if err := checkHop(resp.Request.URL, u); err != nil {
				return nil, fmt.Errorf("%s: the next page: %w", what, err)
			}
		}
	}
	if err := checkPaths(all); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return all, nil
}

// checkPaths refuses a listing no git tree can hold, whatever the filters keep: a path listed twice, or a file
// that is also a directory (cfg and cfg/w.safetensors), which would pack to an artifact that unpacks to neither.
func checkPaths(entries []Entry) error {
	files := make(map[string]int, len(entries))
	for _, e := range entries {
		if e.Type == "file" {
			files[e.Path]++
		}
	}
	for _, e := range entries {
		if e.Type != "file" {
			continue
		}
		for d := path.Dir(e.Path); d != "."; d = path.Dir(d) {
			if files[d] > 0 {
				return fmt.Errorf("the Hub lists a file %q and a file %q inside it: a path cannot be both a file and a directory; refused", d, e.Path)
			}
		}
	}
	for _, e := range entries {
		switch {
		case e.Type == "file" && files[e.Path] > 1:
			return fmt.Errorf("the Hub lists the file %q %d times; refused", e.Path, files[e.Path])
		case e.Type == "directory" && files[e.Path] > 0:
			return fmt.Errorf("the Hub lists %q as a file and as a directory; refused", e.Path)
		}
	}
	return nil
}

// ParseTree parses one page of the tree API and checks what the importer relies on: clean relative paths, sizes,
// a git blob id for every file and a sha256 for every LFS file.
func ParseTree(b []byte) ([]Entry, error) {
	var entries []Entry
	if err := json.Unmarshal(b, &entries); err != nil {
		return nil, fmt.Errorf("the Hub's file list is not the JSON expected: %w", err)
	}
	for _, e := range entries {
		if e.Type != "file" {
			continue
		}
		if !cleanPath(e.Path) {
			return nil, fmt.Errorf("the Hub lists a file at %q, not a clean relative path", e.Path)
		}
		if e.Size < 0 {
			return nil, fmt.Errorf("%s: negative size %d", e.Path, e.Size)
		}
		if e.LFS != nil {
			if !isHex(e.LFS.OID, 64) {
				return nil, fmt.Errorf("%s: LFS oid %q is not a sha256", e.Path, e.LFS.OID)
			}
			if e.LFS.Size != e.Size {
				return nil, fmt.Errorf("%s: LFS size %d differs from the file's %d", e.Path, e.LFS.Size, e.Size)
			}
		} else if !isHex(e.OID, 40) {
			return nil, fmt.Errorf("%s: git oid %q is not a sha1", e.Path, e.OID)
		}
	}
	return entries, nil
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// cleanPath reports whether p is a relative slash-separated path with no empty, "." or ".." component.
func cleanPath(p string) bool {
	if p == "" || strings.ContainsAny(p, "\\\x00") {
		return false
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." {
			return false
		}
	}
	return true
}

// nextLink is the rel="next" target of Link headers, resolved against base, or "".
func nextLink(values []string, base *url.URL) string {
	for _, v := range values {
		for _, link := range strings.Split(v, ",") {
			target, params, ok := strings.Cut(strings.TrimSpace(link), ";")
			if !ok || !strings.HasPrefix(target, "<") || !strings.HasSuffix(target, ">") {
				continue
			}
			for _, p := range strings.Split(params, ";") {
				k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
				if strings.TrimSpace(k) == "rel" && strings.Trim(strings.TrimSpace(v), `"`) == "next" {
					u, err := base.Parse(strings.Trim(target, "<>"))
					if err != nil {
						return ""
					}
					return u.String()
				}
			}
		}
	}
	return ""
}

// fileURL is where resolve serves path at commit.
func (c *Client) fileURL(repo, commit, path string) string {
	parts := strings.Split(path, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return c.Endpoint() + "/" + repo + "/resolve/" + commit + "/" + strings.Join(parts, "/")
}

// OpenFile reads path of repo at commit from offset (GET …/resolve/{commit}/{path} with a Range, following the
// redirect of LFS files to their download host). It returns the offset its stream starts at: offset, or 0 if the
// server ignored the range.
func (c *Client) OpenFile(ctx context.Context, repo, commit, path string, offset int64) (io.ReadCloser, int64, error) {
	h := http.Header{"Accept-Encoding": {"identity"}}
	if offset > 0 {
		h.Set("Range", "bytes="+strconv.FormatInt(offset, 10)+"-")
	}
	what := Scheme + repo + "@" + commit + "/" + path
	resp, err := c.do(ctx, http.MethodGet, c.fileURL(repo, commit, path), what, h, nil)
	if err != nil {
		return nil, 0, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return resp.Body, 0, nil
	case http.StatusPartialContent:
		start, _, ok := remote.ParseContentRange(resp.Header.Get("Content-Range"))
		if !ok {
			resp.Body.Close()
			return nil, 0, fmt.Errorf("%s: unreadable Content-Range %q", what, resp.Header.Get("Content-Range"))
		}
		return resp.Body, start, nil
	}
	resp.Body.Close()
	return nil, 0, fmt.Errorf("%s: unexpected answer %s", what, resp.Status)
}
