package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// TestNodeCacheIsClosedToLocalUsers: the node cache holds every tenant's models, and only the access records say
// who may read one, so a local user on the node cannot walk the host path to a view (a root left open by an older
// release is closed at start), while a pod's process, unprivileged, reads its model through its own mount.
func TestNodeCacheIsClosedToLocalUsers(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	files := drvSmallModel("closed")
	dg := testmodel.Push(t, reg.Host, "models/closed", "v1", files, nil)
	root := filepath.Join(dir, "node")
	if err := os.MkdirAll(filepath.Join(root, "cache"), 0o755); err != nil { // as an older release left it
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // so that only the cache's own mode can stop a local user
		t.Fatal(err)
	}
	d := drvStart(t, root, reg.Host)
	target := drvKubelet(t, dir, "pod")
	if err := drvPublish(d.node(), testenv.PublishRequest("vol", target, map[string]string{"reference": reg.Host + "/models/closed@" + dg.String()}), time.Minute); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(root, "cache"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Fatalf("the cache root is %s, want 0700", fi.Mode().Perm())
	}
	views, err := filepath.Glob(filepath.Join(root, "cache", "views", "*", "model.safetensors"))
	if err != nil || len(views) == 0 {
		t.Fatalf("no view of the model under the cache (%v)", err)
	}
	nobody := func(cwd string, args ...string) ([]byte, error) {
		cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--"}, args...)...)
		cmd.Dir = cwd
		return cmd.CombinedOutput()
	}
	if out, err := nobody("/", "cat", views[0]); err == nil || !strings.Contains(string(out), "Permission denied") {
		t.Fatalf("a local user read %s from the host path (%v): %s", views[0], err, out)
	}
	// A pod's process sees the mount, not its source's parents: started in the target, it reads the file.
	out, err := nobody(target, "cat", "model.safetensors")
	if err != nil || !bytes.Equal(out, files["model.safetensors"]) {
		t.Fatalf("an unprivileged process in the mount read %q (%v)", out, err)
	}
	drvUnpublish(t, d.node(), "vol", target)
}
