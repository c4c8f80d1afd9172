package hubserver

import (
	"net/http"
	"strings"
	"testing"
)

// HEAD of resolve answers as huggingface_hub's get_hf_file_metadata reads it: the commit, the linked etag and size
// of an LFS file on the redirect itself, the git blob id as ETag of another file.
func TestResolveHead(t *testing.T) {
	s := Start(t, Repo{Name: "acme/tiny", Files: map[string][]byte{"w.safetensors": []byte("weights"), "config.json": []byte("{}")}})
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	head := func(p string) *http.Response {
		t.Helper()
		resp, err := client.Head(s.URL + "/acme/tiny/resolve/main/" + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	commit := s.Commit("acme/tiny")
	r := head("w.safetensors")
	if r.StatusCode != http.StatusFound || r.Header.Get("X-Repo-Commit") != commit ||
		r.Header.Get("X-Linked-Etag") != `"`+s.SHA256("acme/tiny", "w.safetensors")+`"` || r.Header.Get("X-Linked-Size") != "7" ||
		!strings.HasPrefix(r.Header.Get("Location"), s.DownloadURL+"/lfs/") {
		t.Errorf("HEAD of an LFS file: %d %v", r.StatusCode, r.Header)
	}
	r = head("config.json")
	if r.StatusCode != http.StatusOK || r.Header.Get("X-Repo-Commit") != commit || r.Header.Get("ETag") != `"`+gitBlobID([]byte("{}"))+`"` ||
		r.Header.Get("Content-Length") != "2" {
		t.Errorf("HEAD of a small file: %d %v", r.StatusCode, r.Header)
	}
	if r := head("absent"); r.StatusCode != http.StatusNotFound || r.Header.Get("X-Error-Code") != "EntryNotFound" {
		t.Errorf("HEAD of a missing file: %d %v", r.StatusCode, r.Header)
	}
}
