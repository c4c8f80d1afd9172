package hf

import (
	"context"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/internal/diskio"
	"github.com/modelpack/modelpack/internal/testenv/hubserver"
)

// A listing no git tree can hold is refused whatever the filters keep, across pages, before any file is read.
func TestTreeRefusesAFileThatIsADirectory(t *testing.T) {
	for name, c := range map[string]struct {
		entries []Entry
		want    []string
	}{
		"file inside a file": {[]Entry{{Type: "file", Path: "cfg"}, {Type: "file", Path: "a/b"}, {Type: "file", Path: "cfg/x/w.safetensors"}}, []string{`"cfg"`, `"cfg/x/w.safetensors"`}},
		"twice":              {[]Entry{{Type: "file", Path: "w"}, {Type: "file", Path: "w"}}, []string{`"w"`, "2 times"}},
		"file and directory": {[]Entry{{Type: "directory", Path: "d"}, {Type: "file", Path: "d"}}, []string{`"d"`, "directory"}},
	} {
		if err := checkPaths(c.entries); err == nil || !strings.Contains(err.Error(), c.want[0]) || !strings.Contains(err.Error(), c.want[1]) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := checkPaths([]Entry{{Type: "directory", Path: "cfg"}, {Type: "file", Path: "cfg/a"}, {Type: "file", Path: "cfgx"}, {Type: "file", Path: "cfg.json"}}); err != nil {
		t.Errorf("a clean listing: %v", err)
	}

	s := hubserver.Start(t, hubserver.Repo{Name: "acme/clash", Files: map[string][]byte{"cfg": []byte("{}"), "cfg/w.safetensors": []byte("w"), "z.json": []byte("{}")}})
	s.PageSize = 1
	c, err := NewClient(s.URL, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Snapshot(context.Background(), Ref{Repo: "acme/clash", Revision: "main"}, Options{TempDir: t.TempDir(), Include: []string{"*.json"}})
	if err == nil || !strings.Contains(err.Error(), `"cfg"`) || !strings.Contains(err.Error(), `"cfg/w.safetensors"`) {
		t.Fatalf("snapshot of a listing with cfg and cfg/w.safetensors: %v", err)
	}
	for _, r := range s.Requests() {
		if strings.Contains(r.Path, "/resolve/") || r.Host != "hub" {
			t.Errorf("%s %s read before the listing was refused", r.Method, r.Path)
		}
	}
}

// Claimed sizes are checked before anything is downloaded: against the free space of the staging directory (files
// outside LFS), of the destination (LFS files it does not hold), and against the bound no Hub file reaches.
func TestSnapshotChecksClaimedSizes(t *testing.T) {
	s := hubserver.Start(t, hubserver.Repo{Name: "acme/huge", Files: map[string][]byte{"config.json": []byte("{}"), "w.safetensors": []byte("weights")}})
	c, err := NewClient(s.URL, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	ref := Ref{Repo: "acme/huge", Revision: "main"}
	tmp, dest := t.TempDir(), t.TempDir()
	free, err := diskio.FreeSpace(dest)
	if err != nil {
		t.Fatal(err)
	}
	snapshot := func(o Options) error {
		t.Helper()
		before := len(s.Requests())
		o.TempDir = tmp
		snap, err := c.Snapshot(context.Background(), ref, o)
		if err == nil {
			snap.Close()
		}
		for _, r := range s.Requests()[before:] {
			if err != nil && (strings.Contains(r.Path, "/resolve/") || r.Host != "hub") {
				t.Errorf("%s %s read before the claim was refused", r.Method, r.Path)
			}
		}
		return err
	}
	sha := digest.NewDigestFromEncoded(digest.SHA256, s.SHA256("acme/huge", "w.safetensors"))

	s.ClaimSize = map[string]int64{"w.safetensors": 1 << 40}
	if err := snapshot(Options{Dest: dest}); err == nil || !strings.Contains(err.Error(), "w.safetensors") || !strings.Contains(err.Error(), "1.0 TiB") ||
		!strings.Contains(err.Error(), " free for ") || !strings.Contains(err.Error(), "local store") {
		t.Errorf("a 1 TiB weight into the store: %v (free %s)", err, humanBytes(free))
	}
	// Held by the store, it need not fit; streamed elsewhere (--push), only the bound applies.
	s.ClaimSize = map[string]int64{"w.safetensors": max(free+1<<30, 100<<30)}
	if err := snapshot(Options{Dest: dest, Held: func(d digest.Digest, size int64) bool { return d == sha && size > free }}); err != nil {
		t.Errorf("a 1 TiB weight the store holds: %v", err)
	}
	if err := snapshot(Options{}); err != nil {
		t.Errorf("a 1 TiB weight pushed: %v", err)
	}
	s.ClaimSize = map[string]int64{"w.safetensors": maxFileSize + 1}
	if err := snapshot(Options{}); err == nil || !strings.Contains(err.Error(), "w.safetensors") || !strings.Contains(err.Error(), "above the 500 GiB") {
		t.Errorf("a weight above the bound, pushed: %v", err)
	}
	// A file outside LFS is staged: it must fit in the staging directory.
	s.ClaimSize = map[string]int64{"config.json": 1 << 40}
	if err := snapshot(Options{}); err == nil || !strings.Contains(err.Error(), "config.json") || !strings.Contains(err.Error(), "1.0 TiB") ||
		!strings.Contains(err.Error(), "staging directory") {
		t.Errorf("a 1 TiB config: %v", err)
	}
	// Sizes that each fit but not together.
	s.ClaimSize = map[string]int64{"config.json": free / 2, "w.safetensors": free/2 + 1<<30}
	if err := snapshot(Options{Dest: dest}); err == nil || !strings.Contains(err.Error(), "w.safetensors") || !strings.Contains(err.Error(), "in all") {
		t.Errorf("two files that do not fit together: %v", err)
	}
}
