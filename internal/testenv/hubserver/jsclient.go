package hubserver

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// SnapshotDownload downloads repo at revision into cacheDir with the official JS client's snapshotDownload
// (@huggingface/hub, pinned in npm/package-lock.json, installed into bin/npm by `make tools`), pointed at this
// server with token (if not empty), and returns the snapshot directory it reports.
func (s *Server) SnapshotDownload(t testing.TB, repo, revision, cacheDir, token string) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Unavailable(t, "node not installed")
	}
	js := filepath.Join(testenv.RepoRoot(), "bin", "npm")
	if _, err := os.Stat(filepath.Join(js, "node_modules", "@huggingface", "hub", "package.json")); err != nil {
		testenv.Unavailable(t, "@huggingface/hub not installed in bin/npm: run `make tools`")
	}
	script := filepath.Join(testenv.RepoRoot(), "internal", "testenv", "hubserver", "npm", "snapshot.cjs")
	cmd := exec.Command(node, script, repo, revision, cacheDir)
	cmd.Env = append(os.Environ(), "HUB_JS="+js, "HF_ENDPOINT="+s.URL, "HF_TOKEN="+token)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("@huggingface/hub snapshotDownload %s@%s: %v\n%s", repo, revision, err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}
