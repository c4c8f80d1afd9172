// Package hubserver is a local Hugging Face Hub for tests: the part of the Hub's HTTP API that modelpack's
// importer and the official clients (huggingface_hub, @huggingface/hub) use — model info at a revision, the file
// tree (recursive, paginated, with LFS metadata), paths-info, the commit history, and resolve with HEAD, Range and
// the redirect of LFS files to a separate download host — with gated repositories and faults (429 with
// Retry-After, corrupted LFS bytes, connections cut part way, and a hostile Hub's redirects and next pages to
// other hosts) to test against.
//
// The download host is the Hub's own socket under another name (DownloadURL: localhost where URL says 127.0.0.1),
// so it is another origin, as the Hub's CDN is, that a client which refuses loopback addresses other than its
// endpoint's may still reach. Requests there for anything but an LFS file are the other origin's (Host "other"):
// a hostile Hub's redirects and next pages lead there (Redirect, NextPage) to see what a client sends away from
// the Hub. Trap is a server elsewhere on loopback that no client should reach at all.
package hubserver

import (
	"bytes"
	"cmp"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Repo is a model repository with one commit.
type Repo struct {
	Name  string            // ORG/NAME, or datasets/ORG/NAME for a dataset (the Hub's /api/datasets/… and /datasets/…)
	Files map[string][]byte // path → content; directories are implied
	// LFS reports whether a file is stored in LFS; nil means weights by extension and files of 10 KiB or more.
	LFS func(path string, size int) bool
	// Token, if set, gates the repository: every request must carry "Authorization: Bearer <Token>".
	Token       string
	Tags        []string // tags naming the commit besides the branch main
	LibraryName string
	CardData    map[string]any
	Date        time.Time // the commit's date (default 2024-05-01T12:00:00Z)
}

// Request is one request a server received.
type Request struct {
	Host   string // "hub", "download" or "other" (the other origin at OtherURL)
	Method string
	Path   string
	Range  string
	Auth   string // the Authorization header
}

// Server is a running local Hub. Its fields other than URL, DownloadURL and OtherURL may be changed while it runs.
type Server struct {
	URL         string // the Hub endpoint (HF_ENDPOINT, hubUrl)
	DownloadURL string // the host LFS files are redirected to: another origin, on the same socket
	OtherURL    string // another origin on the same socket, serving the Hub's API and files to anyone, unauthenticated
	hubHost     string

	mu       sync.Mutex
	repos    map[string]*repo
	requests []Request
	// PageSize is how many entries a tree page holds (default 1000).
	PageSize int
	// RateLimit answers this many next requests of the Hub (not the download host) with 429 and Retry-After.
	RateLimit  int
	RetryAfter string
	// Corrupt flips a byte in the middle of the file of this sha256 as served (by the download host for an LFS
	// file, by resolve for another).
	Corrupt map[string]bool
	// CutAfter makes the download host close the connection after this many bytes of the body of the next
	// request for the LFS file of this sha256, once.
	CutAfter map[string]int64
	// StallAfter makes the download host send this many bytes of the body of the next request for the LFS file of
	// this sha256, once, call OnStall, and then send nothing until the client goes away.
	StallAfter map[string]int64
	OnStall    func()
	// StallAPI makes the next this many answers of an API of the Hub (revision, tree, commits, paths-info: what
	// follows the repository in the path) send their headers and half their body, and then nothing until the client
	// goes away.
	StallAPI map[string]int
	// TrickleAPI makes every answer of the Hub's API send its body one byte per TrickleAPI.
	TrickleAPI time.Duration
	// Redirect makes resolve of a file (by its path in the repository) answer with this redirect, at any
	// revision, instead of serving it.
	Redirect map[string]Redirect
	// NextPage, if set, is the scheme://host the tree's next-page links name instead of the Hub's (OtherURL, say).
	NextPage string
	// OtherRateLimit answers this many next requests of the other origin with 429 and Retry-After.
	OtherRateLimit int
	// ClaimSize makes the listings (tree, paths-info) state this size for a file (by path), whatever it holds.
	ClaimSize map[string]int64

	hub    *httptest.Server
	secret []byte
}

// Redirect is a resolve answer of a hostile Hub: Status (default 302 Found) to Location.
type Redirect struct {
	Status   int
	Location string
}

type repo struct {
	Repo
	commit string
	files  map[string]*file
	dirs   []string
}

type file struct {
	path   string
	data   []byte
	oid    string // git blob id
	sha256 string
	lfs    bool
}

// Start serves repos over plain HTTP until the test ends.
func Start(t testing.TB, repos ...Repo) *Server {
	t.Helper()
	s := newServer(t, repos)
	s.hub.Start()
	s.started(t)
	return s
}

// StartTLS serves repos over HTTPS (127.0.0.1 and localhost) until the test ends, and returns the file of the CA
// that signed its certificate (SSL_CERT_FILE for a client).
func StartTLS(t testing.TB, repos ...Repo) (*Server, string) {
	t.Helper()
	s := newServer(t, repos)
	caFile, certFile, keyFile := testenv.WriteCA(t)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	s.hub.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	s.hub.StartTLS()
	s.started(t)
	return s, caFile
}

func newServer(t testing.TB, repos []Repo) *Server {
	s := &Server{repos: map[string]*repo{}, secret: []byte(t.Name()), Corrupt: map[string]bool{}, CutAfter: map[string]int64{},
		StallAfter: map[string]int64{}, StallAPI: map[string]int{}, RetryAfter: "1", Redirect: map[string]Redirect{}, ClaimSize: map[string]int64{}}
	for _, r := range repos {
		s.Add(r)
	}
	s.hub = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	return s
}

func (s *Server) started(t testing.TB) {
	u, _ := url.Parse(s.hub.URL)
	s.URL, s.hubHost = s.hub.URL, u.Host
	s.DownloadURL = u.Scheme + "://localhost:" + u.Port()
	s.OtherURL = s.DownloadURL
	t.Cleanup(func() {
		s.hub.CloseClientConnections()
		s.hub.Close()
	})
}

// serve tells the origins apart by the name the client asked for.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Host == s.hubHost:
		s.record("hub", r)
		s.serveHub(w, r)
	case strings.HasPrefix(r.URL.Path, "/lfs/"):
		s.serveDownload(w, r)
	default:
		s.record("other", r)
		s.mu.Lock()
		limited := s.OtherRateLimit > 0
		if limited {
			s.OtherRateLimit--
		}
		retry := s.RetryAfter
		s.mu.Unlock()
		if limited {
			w.Header().Set("Retry-After", retry)
			hubError(w, http.StatusTooManyRequests, "", "You have been rate-limited; you can retry this action in a moment.")
			return
		}
		s.serveHub(w, r)
	}
}

// Add serves another repository (or replaces one of the same name).
func (s *Server) Add(r Repo) {
	if r.Date.IsZero() {
		r.Date = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	}
	if r.LFS == nil {
		r.LFS = func(p string, size int) bool {
			switch path.Ext(p) {
			case ".safetensors", ".bin", ".gguf", ".onnx", ".pt", ".pth":
				return true
			}
			return size >= 10<<10
		}
	}
	rp := &repo{Repo: r, files: map[string]*file{}}
	names := make([]string, 0, len(r.Files))
	for p := range r.Files {
		names = append(names, p)
	}
	sort.Strings(names)
	h := sha1.New()
	dirs := map[string]bool{}
	for _, p := range names {
		b := r.Files[p]
		sum := sha256.Sum256(b)
		f := &file{path: p, data: b, oid: gitBlobID(b), sha256: hex.EncodeToString(sum[:]), lfs: r.LFS(p, len(b))}
		rp.files[p] = f
		fmt.Fprintf(h, "%s %s\n", f.oid, p)
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	fmt.Fprintf(h, "%s %s\n", r.Name, r.Date)
	rp.commit = hex.EncodeToString(h.Sum(nil))
	for d := range dirs {
		rp.dirs = append(rp.dirs, d)
	}
	sort.Strings(rp.dirs)
	s.mu.Lock()
	s.repos[r.Name] = rp
	s.mu.Unlock()
}

// Commit is the commit id of a served repository.
func (s *Server) Commit(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.repos[name].commit
}

// SHA256 is the sha256 (hex) of a file of a served repository.
func (s *Server) SHA256(name, p string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.repos[name].files[p].sha256
}

// Requests returns the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

func (s *Server) record(host string, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, Request{Host: host, Method: r.Method, Path: r.URL.Path, Range: r.Header.Get("Range"), Auth: r.Header.Get("Authorization")})
}

func gitBlobID(b []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(b))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

func hubError(w http.ResponseWriter, status int, code, msg string) {
	if code != "" {
		w.Header().Set("X-Error-Code", code)
	}
	w.Header().Set("X-Error-Message", msg)
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	json.NewEncoder(w).Encode(v)
}

// splitEscaped splits an escaped URL path into unescaped components, so that a revision such as refs%2Fpr%2F1
// stays one component.
func splitEscaped(p string) []string {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	for i, c := range parts {
		if u, err := url.PathUnescape(c); err == nil {
			parts[i] = u
		}
	}
	return parts
}

func (s *Server) serveHub(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	limited := s.RateLimit > 0
	if limited {
		s.RateLimit--
	}
	retry := s.RetryAfter
	s.mu.Unlock()
	if limited {
		w.Header().Set("Retry-After", retry)
		hubError(w, http.StatusTooManyRequests, "", "You have been rate-limited; you can retry this action in a moment.")
		return
	}
	parts := splitEscaped(r.URL.EscapedPath())
	// Datasets have the models' API under their own prefix (/api/datasets/ORG/NAME/…, /datasets/ORG/NAME/resolve/…),
	// served here from the repository named datasets/ORG/NAME.
	kind := ""
	switch {
	case len(parts) >= 2 && parts[0] == "api" && parts[1] == "datasets":
		parts[1], kind = "models", "datasets/"
	case len(parts) >= 1 && parts[0] == "datasets":
		parts, kind = parts[1:], "datasets/"
	}
	if len(parts) >= 5 && parts[0] == "api" && parts[1] == "models" {
		s.mu.Lock()
		stall, trickle := s.StallAPI[parts[4]] > 0, s.TrickleAPI
		if stall {
			s.StallAPI[parts[4]]--
		}
		s.mu.Unlock()
		if !stall && trickle <= 0 {
			s.serveAPI(w, r, kind+parts[2]+"/"+parts[3], parts[4], parts[5:])
			return
		}
		rec := httptest.NewRecorder()
		s.serveAPI(rec, r, kind+parts[2]+"/"+parts[3], parts[4], parts[5:])
		maps.Copy(w.Header(), rec.Header())
		w.WriteHeader(rec.Code)
		body := rec.Body.Bytes()
		if stall {
			w.Write(body[:len(body)/2])
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		for i := range body {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(trickle):
			}
			w.Write(body[i : i+1])
			w.(http.Flusher).Flush()
		}
		return
	}
	if len(parts) >= 5 && parts[2] == "resolve" {
		s.serveResolve(w, r, kind+parts[0]+"/"+parts[1], parts[3], strings.Join(parts[4:], "/"))
		return
	}
	hubError(w, http.StatusNotFound, "", "Sorry, we can't find the page you are looking for.")
}

// lookup finds the repository and resolves the revision, answering the error itself when it cannot.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request, name, rev string) (*repo, bool) {
	s.mu.Lock()
	rp := s.repos[name]
	s.mu.Unlock()
	if rp == nil {
		hubError(w, http.StatusUnauthorized, "RepoNotFound", "Repository not found")
		return nil, false
	}
	if rp.Token != "" {
		switch auth := r.Header.Get("Authorization"); auth {
		case "Bearer " + rp.Token:
		case "":
			hubError(w, http.StatusUnauthorized, "GatedRepo", "Access to model "+name+" is restricted. You must have access to it and be authenticated to access it. Please log in.")
			return nil, false
		default:
			hubError(w, http.StatusForbidden, "GatedRepo", "Access to model "+name+" is restricted and you are not in the authorized list.")
			return nil, false
		}
	}
	ok := rev == rp.commit || rev == "main" || rev == "HEAD"
	for _, t := range rp.Tags {
		ok = ok || rev == t
	}
	if !ok {
		hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
		return nil, false
	}
	return rp, true
}

func (rp *repo) entry(p string, expand bool) map[string]any {
	lastCommit := map[string]any{"id": rp.commit, "title": "Upload", "date": rp.Date.Format(time.RFC3339Nano)}
	if f := rp.files[p]; f != nil {
		e := map[string]any{"type": "file", "oid": f.oid, "size": len(f.data), "path": p}
		if f.lfs {
			ptr := fmt.Sprintf("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n", f.sha256, len(f.data))
			e["oid"] = gitBlobID([]byte(ptr))
			e["lfs"] = map[string]any{"oid": f.sha256, "size": len(f.data), "pointerSize": len(ptr)}
		}
		if expand {
			e["lastCommit"] = lastCommit
			e["securityFileStatus"] = map[string]any{"status": "safe"}
		}
		return e
	}
	for _, d := range rp.dirs {
		if d == p {
			e := map[string]any{"type": "directory", "oid": gitBlobID([]byte(p)), "size": 0, "path": p}
			if expand {
				e["lastCommit"] = lastCommit
			}
			return e
		}
	}
	return nil
}

// entry is rp.entry as listed, with the size ClaimSize states for it.
func (s *Server) entry(rp *repo, p string, expand bool) map[string]any {
	e := rp.entry(p, expand)
	s.mu.Lock()
	size, claimed := s.ClaimSize[p]
	s.mu.Unlock()
	if e != nil && claimed {
		e["size"] = size
		if lfs, ok := e["lfs"].(map[string]any); ok {
			lfs["size"] = size
		}
	}
	return e
}

func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request, name, kind string, rest []string) {
	if len(rest) == 0 {
		hubError(w, http.StatusNotFound, "", "no revision")
		return
	}
	rp, ok := s.lookup(w, r, name, rest[0])
	if !ok {
		return
	}
	switch {
	case kind == "revision" && r.Method == http.MethodGet:
		var siblings []map[string]string
		for _, p := range sortedKeys(rp.files) {
			siblings = append(siblings, map[string]string{"rfilename": p})
		}
		gated := any(false)
		if rp.Token != "" {
			gated = "manual"
		}
		info := map[string]any{
			"_id": rp.commit[:24], "id": name, "modelId": name, "author": strings.Split(name, "/")[0], "sha": rp.commit,
			"private": false, "gated": gated, "disabled": false, "downloads": 0, "likes": 0, "tags": []string{},
			"pipeline_tag": "text-generation", "lastModified": rp.Date.Format(time.RFC3339Nano),
			"createdAt": rp.Date.Format(time.RFC3339Nano), "siblings": siblings,
		}
		if rp.LibraryName != "" {
			info["library_name"] = rp.LibraryName
		}
		if rp.CardData != nil {
			info["cardData"] = rp.CardData
		}
		writeJSON(w, info)
	case kind == "commits" && r.Method == http.MethodGet:
		writeJSON(w, []map[string]any{{"id": rp.commit, "title": "Upload", "message": "", "authors": []map[string]string{{"user": "acme"}},
			"date": rp.Date.Format(time.RFC3339Nano)}})
	case kind == "tree" && r.Method == http.MethodGet:
		s.serveTree(w, r, rp, strings.Join(rest[1:], "/"))
	case kind == "paths-info" && r.Method == http.MethodPost:
		var req struct {
			Paths  []string `json:"paths"`
			Expand bool     `json:"expand"`
		}
		if strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
			json.NewDecoder(r.Body).Decode(&req)
		} else {
			r.ParseForm()
			req.Paths = r.PostForm["paths"]
			req.Expand = r.PostForm.Get("expand") == "true" || r.PostForm.Get("expand") == "True"
		}
		out := []map[string]any{}
		for _, p := range req.Paths {
			if e := s.entry(rp, strings.Trim(p, "/"), req.Expand); e != nil {
				out = append(out, e)
			}
		}
		writeJSON(w, out)
	default:
		hubError(w, http.StatusNotFound, "", "no such API")
	}
}

func (s *Server) serveTree(w http.ResponseWriter, r *http.Request, rp *repo, under string) {
	q := r.URL.Query()
	recursive := q.Get("recursive") == "true" || q.Get("recursive") == "True" || q.Get("recursive") == "1"
	expand := q.Get("expand") == "true" || q.Get("expand") == "True" || q.Get("expand") == "1"
	var paths []string
	for _, p := range append(append([]string{}, rp.dirs...), sortedKeys(rp.files)...) {
		rel := p
		if under != "" {
			var ok bool
			if rel, ok = strings.CutPrefix(p, under+"/"); !ok {
				continue
			}
		}
		if recursive || !strings.Contains(rel, "/") {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	start, _ := strconv.Atoi(q.Get("cursor"))
	s.mu.Lock()
	size := s.PageSize
	nextPage := s.NextPage
	s.mu.Unlock()
	if size <= 0 {
		size = 1000
	}
	start = min(max(start, 0), len(paths))
	end := min(start+size, len(paths))
	if end < len(paths) {
		next := *r.URL
		nq := next.Query()
		nq.Set("cursor", strconv.Itoa(end))
		next.RawQuery = nq.Encode()
		base := s.URL
		if nextPage != "" {
			base = nextPage
		}
		w.Header().Set("Link", fmt.Sprintf("<%s%s>; rel=\"next\"", base, next.RequestURI()))
	}
	out := []map[string]any{}
	for _, p := range paths[start:end] {
		out = append(out, s.entry(rp, p, expand))
	}
	writeJSON(w, out)
}

func (s *Server) sign(sha string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(sha))
	return hex.EncodeToString(m.Sum(nil))
}

func (s *Server) serveResolve(w http.ResponseWriter, r *http.Request, name, rev, p string) {
	rp, ok := s.lookup(w, r, name, rev)
	if !ok {
		return
	}
	f := rp.files[p]
	if f == nil {
		hubError(w, http.StatusNotFound, "EntryNotFound", p+" does not exist on \""+rev+"\"")
		return
	}
	s.mu.Lock()
	redirect, redirected := s.Redirect[p]
	s.mu.Unlock()
	if redirected {
		w.Header().Set("Location", redirect.Location)
		w.WriteHeader(cmp.Or(redirect.Status, http.StatusFound))
		return
	}
	w.Header().Set("X-Repo-Commit", rp.commit)
	w.Header().Set("Accept-Ranges", "bytes")
	if f.lfs {
		w.Header().Set("X-Linked-Etag", `"`+f.sha256+`"`)
		w.Header().Set("X-Linked-Size", strconv.Itoa(len(f.data)))
		w.Header().Set("ETag", `"`+f.oid+`"`)
		w.Header().Set("Location", s.DownloadURL+"/lfs/"+f.sha256+"?sig="+s.sign(f.sha256))
		w.WriteHeader(http.StatusFound)
		return
	}
	w.Header().Set("ETag", `"`+f.oid+`"`)
	data := f.data
	s.mu.Lock()
	if s.Corrupt[f.sha256] {
		data = append([]byte(nil), data...)
		data[len(data)/2] ^= 0xff
	}
	s.mu.Unlock()
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
}

func (s *Server) serveDownload(w http.ResponseWriter, r *http.Request) {
	s.record("download", r)
	sha, ok := strings.CutPrefix(r.URL.Path, "/lfs/")
	if !ok || !hmac.Equal([]byte(r.URL.Query().Get("sig")), []byte(s.sign(sha))) {
		http.Error(w, "AccessDenied: bad signature", http.StatusForbidden)
		return
	}
	var f *file
	s.mu.Lock()
	for _, rp := range s.repos {
		for _, c := range rp.files {
			if c.sha256 == sha && c.lfs {
				f = c
			}
		}
	}
	corrupt := s.Corrupt[sha]
	cut, cutting := s.CutAfter[sha]
	if cutting && r.Method == http.MethodGet {
		delete(s.CutAfter, sha)
	}
	stall, stalling := s.StallAfter[sha]
	if stalling && r.Method == http.MethodGet {
		delete(s.StallAfter, sha)
	}
	onStall := s.OnStall
	s.mu.Unlock()
	if f == nil {
		http.Error(w, "NoSuchKey", http.StatusNotFound)
		return
	}
	data := f.data
	if corrupt {
		data = append([]byte(nil), data...)
		data[len(data)/2] ^= 0xff
	}
	w.Header().Set("ETag", `"`+f.sha256+`"`)
	w.Header().Set("Content-Type", "application/octet-stream")
	if cutting && r.Method == http.MethodGet {
		// Announce the whole body, send part of it and drop the connection, as a failing proxy or network does.
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.WriteHeader(http.StatusOK)
		w.Write(data[:min(cut, int64(len(data)))])
		w.(http.Flusher).Flush()
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.SetLinger(0)
			}
			conn.Close()
		}
		return
	}
	if stalling && r.Method == http.MethodGet {
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.WriteHeader(http.StatusOK)
		w.Write(data[:min(stall, int64(len(data)))])
		w.(http.Flusher).Flush()
		if onStall != nil {
			onStall()
		}
		<-r.Context().Done()
		return
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
}

func sortedKeys(m map[string]*file) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Trap is a server elsewhere on loopback (the node's kubelet, a metadata service) that a hostile Hub points its
// clients at: it answers 200 to anything, and records what it receives.
type Trap struct {
	URL string // http://ADDR

	mu       sync.Mutex
	requests []Request
}

// StartTrap listens on addr ("127.0.0.1:0", "[::1]:0") until the test ends.
func StartTrap(t testing.TB, addr string) *Trap {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		testenv.Unavailable(t, "listen on %s: %v", addr, err)
	}
	tr := &Trap{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tr.mu.Lock()
		tr.requests = append(tr.requests, Request{Host: r.Host, Method: r.Method, Path: r.URL.Path, Range: r.Header.Get("Range"), Auth: r.Header.Get("Authorization")})
		tr.mu.Unlock()
		w.Write([]byte(`{"AccessKeyId":"trapped"}`))
	}))
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	tr.URL = srv.URL
	t.Cleanup(srv.Close)
	return tr
}

// Requests returns the requests received so far.
func (tr *Trap) Requests() []Request {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]Request(nil), tr.requests...)
}
