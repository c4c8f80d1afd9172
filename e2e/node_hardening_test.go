package e2e

// The node plugin against a local user and a local attacker (issue 31 §5 and §7): its sockets under any umask,
// stale and live sockets of others, targets reached through links, and blobs re-hashed after an unclean start
// while views of them are made and deleted. The real binary, a real unprivileged user (nobody), real links and
// mounts.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

const nobodyID = 65534

// openToAll makes dir and its parent (t.TempDir's, 0700) traversable by every user, so that only the modes the
// driver sets stand between nobody and its sockets.
func openToAll(t *testing.T, dir string) {
	t.Helper()
	for _, p := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// asNobody runs a command as user nobody and returns its output and error.
func asNobody(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = []string{"HOME=/nonexistent", "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyID, Gid: nobodyID}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// buildCSIClient builds e2e/cmd/csiclient (kubelet's side of CSI) into dir, where every user may run it.
func buildCSIClient(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "csiclient")
	cmd := exec.Command("go", "build", "-o", bin, "./e2e/cmd/csiclient")
	cmd.Dir = testenv.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build csiclient: %v\n%s", err, out)
	}
	return bin
}

// waitFor polls until cond holds (a file the driver creates after it answers), failing after 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 30s", what)
		}
	}
}

func wantPrivateSocket(t *testing.T, p string) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFSOCK || st.Mode&0o777 != 0o600 || st.Uid != 0 {
		t.Errorf("%s: mode %#o uid %d, want a socket 0600 of root", p, st.Mode, st.Uid)
	}
}

// Under umask 000 and 002 both sockets are root's alone: nobody cannot publish through the CSI socket into a
// root-only directory, nor reach the prepull API.
func TestDriverSocketsAreRootsAloneUnderAnyUmask(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	openToAll(t, dir)
	drvCleanupMounts(t, dir)
	csiclient := buildCSIClient(t, dir)
	bin := testenv.Modelpack(t)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	testmodel.Push(t, reg.Host, "models/tiny", "v1", drvSmallModel("v1"), nil)
	for _, umask := range []string{"000", "002"} {
		t.Run("umask "+umask, func(t *testing.T) {
			root := filepath.Join(dir, "node-"+umask)
			d := drvStartUmask(t, root, umask, nil, reg.Host)
			prepullSock := filepath.Join(root, "prepull.sock")
			waitFor(t, "prepull.sock", func() bool { _, err := os.Lstat(prepullSock); return err == nil })
			wantPrivateSocket(t, d.Sock)
			wantPrivateSocket(t, prepullSock)

			private := filepath.Join(dir, "root-only-"+umask)
			if err := os.Mkdir(private, 0o700); err != nil {
				t.Fatal(err)
			}
			target := filepath.Join(private, "mount")
			out, err := asNobody(t, csiclient, "-endpoint", "unix://"+d.Sock, "publish", "-target", target,
				"-attr", "reference=registry.invalid/m:v1", "-timeout", "10s")
			if err == nil || !strings.Contains(out, "permission denied") {
				t.Fatalf("nobody publishing through csi.sock: %v\n%s", err, out)
			}
			if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("nobody's publish reached the driver: %s exists (%v)", target, err)
			}
			out, err = asNobody(t, bin, "prepull", "status", "--socket", prepullSock)
			if err == nil || !strings.Contains(out, "permission denied") {
				t.Fatalf("nobody reaching the prepull API: %v\n%s", err, out)
			}

			// Root (kubelet) publishes as ever, and nothing the driver wrote for it is writable by group or others.
			own := drvKubelet(t, dir, "pod-"+umask)
			if err := drvPublish(d.node(), testenv.PublishRequest("vol", own, map[string]string{"reference": reg.Host + "/models/tiny:v1"}), time.Minute); err != nil {
				t.Fatal(err)
			}
			filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
				if err != nil || de.Type()&fs.ModeSymlink != 0 {
					return nil
				}
				if fi, err := de.Info(); err == nil && fi.Mode().Perm()&0o022 != 0 && p != d.log {
					t.Errorf("%s is %v under umask %s", p, fi.Mode(), umask)
				}
				return nil
			})
			drvUnpublish(t, d.node(), "vol", own)
		})
	}
}

// drvStartFails runs the driver expecting it to refuse to start, and returns what it said.
func drvStartFails(t *testing.T, root, sock string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.Modelpack(t), "csi-driver", "--endpoint", "unix://"+sock, "--node-id", "e2e-node",
		"--root", root, "--metrics-addr", "", "--registry-config", testenv.EmptyDockerConfig(t))
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("driver did not refuse to start (%v):\n%s", err, out)
	}
	return string(out)
}

// staleSocket leaves a socket file at p that nothing listens on, as a killed process does, owned by uid.
func staleSocket(t *testing.T, p string, uid int) {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if err := os.Lchown(p, uid, uid); err != nil {
		t.Fatal(err)
	}
}

// The socket's directory and what is at the socket's name: a 0777 directory of the driver's is tightened; another
// user's stale socket, a file or a link at the name stops the driver with an error naming it, and is left; a
// second driver pointed at the first's prepull socket leaves it alone, live and in place, when it starts and when it
// stops.
func TestDriverSocketDirectoryAndWhatIsThere(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)

	t.Run("a 0777 socket directory is tightened", func(t *testing.T) {
		root := filepath.Join(dir, "open")
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		os.Chmod(root, 0o777)
		d := drvStart(t, root)
		wantPrivateSocket(t, d.Sock)
		if fi, _ := os.Stat(root); fi.Mode().Perm() != 0o755 {
			t.Errorf("socket directory left %v", fi.Mode())
		}
		if !strings.Contains(drvRead(t, d.log), "socket directory was writable by group or others") {
			t.Error("the fix is not logged")
		}
	})

	t.Run("another user's stale socket, a file or a link at the name", func(t *testing.T) {
		for _, c := range []struct {
			name, want string
			plant      func(p string)
		}{
			{"another user's socket", "uid 65534", func(p string) { staleSocket(t, p, nobodyID) }},
			{"a file", "not a socket", func(p string) { os.WriteFile(p, []byte("x"), 0o600) }},
			{"a link", "not a socket", func(p string) { os.Symlink(filepath.Join(dir, "elsewhere"), p) }},
		} {
			root := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
			os.MkdirAll(root, 0o755)
			sock := filepath.Join(root, "csi.sock")
			c.plant(sock)
			if out := drvStartFails(t, root, sock); !strings.Contains(out, sock) || !strings.Contains(out, c.want) {
				t.Errorf("%s: driver said:\n%s\nwant the socket named and %q", c.name, out, c.want)
			}
			if _, err := os.Lstat(sock); err != nil {
				t.Errorf("%s: removed (%v)", c.name, err)
			}
		}
	})

	t.Run("a second driver leaves the first's live prepull socket", func(t *testing.T) {
		first := drvStart(t, filepath.Join(dir, "first"))
		sock := filepath.Join(first.Root, "prepull.sock")
		waitFor(t, "prepull.sock", func() bool { _, err := os.Lstat(sock); return err == nil })
		var before syscall.Stat_t
		syscall.Lstat(sock, &before)
		status := func() error {
			out, err := exec.Command(testenv.Modelpack(t), "prepull", "status", "--socket", sock).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		}
		if err := status(); err != nil {
			t.Fatal(err)
		}
		second := drvStartWith(t, filepath.Join(dir, "second"), []string{"--prepull-socket", sock})
		waitFor(t, "the second driver's prepull refusal", func() bool {
			return strings.Contains(drvRead(t, second.log), "another process serves")
		})
		second.stop()
		var after syscall.Stat_t
		if err := syscall.Lstat(sock, &after); err != nil || after.Ino != before.Ino {
			t.Fatalf("the first driver's prepull.sock was removed or replaced (%v)", err)
		}
		if err := status(); err != nil {
			t.Fatalf("the first driver's prepull API after the second came and went: %v", err)
		}
	})
}

// A target whose parent (or grandparent) kubelet directory was swapped for a link to a root-only directory is
// refused with InvalidArgument naming target_path; nothing is created or mounted behind the link.
func TestDriverTargetThroughALinkIsRefused(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	testmodel.Push(t, reg.Host, "models/tiny", "v1", drvSmallModel("v1"), nil)
	d := drvStart(t, filepath.Join(dir, "node"), reg.Host)
	node := d.node()
	behind := filepath.Join(dir, "root-only")
	if err := os.Mkdir(behind, 0o700); err != nil {
		t.Fatal(err)
	}
	for i, up := range []int{1, 2} {
		target := drvKubelet(t, dir, fmt.Sprint("pod-", i))
		swap := target
		for range up {
			swap = filepath.Dir(swap)
		}
		dest := filepath.Join(behind, fmt.Sprint(i))
		os.MkdirAll(filepath.Join(dest, "model"), 0o750)
		if err := os.RemoveAll(swap); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(dest, swap); err != nil {
			t.Fatal(err)
		}
		err := drvPublish(node, testenv.PublishRequest(fmt.Sprint("vol-", i), target, map[string]string{"reference": reg.Host + "/models/tiny:v1"}), time.Minute)
		drvWantCode(t, err, codes.InvalidArgument, "target_path")
		drvWantCode(t, err, codes.InvalidArgument, swap+" is a symbolic link")
		entries, _ := filepath.Glob(filepath.Join(dest, "*", "*"))
		entries2, _ := filepath.Glob(filepath.Join(dest, "*"))
		for _, e := range append(entries, entries2...) {
			if filepath.Base(e) == "mount" {
				t.Errorf("%s created behind the link", e)
			}
		}
	}
	testenv.NoMountsLeftUnder(t, behind)
}

// Right after an unclean restart (SIGKILL) every blob is suspect and the scrub re-hashes them all, slowly. Publishes
// and unpublishes all through the scrub's pass, each building a view of its own (new links of the blobs, each
// changing their ctime, while the scrub reads them) and deleting it, must all succeed: an intact blob is never
// called corrupt, nor refused.
func TestDriverIntactBlobsAfterAnUncleanRestart(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	model := drvModel{"config.json": []byte(`{"a":1}`)}
	for i := range 4 {
		model[fmt.Sprintf("model-%05d-of-00004.safetensors", i+1)] = randomBytes(t, 4<<20)
	}
	testmodel.Push(t, reg.Host, "models/sharded", "v1", model, nil)
	ref := reg.Host + "/models/sharded:v1"
	// A slow scrub (about 16 s a pass): the publishes below link blobs while it reads them.
	d := drvStartWith(t, filepath.Join(dir, "node"), []string{"--cache-scrub-rate", "1MiB"}, reg.Host)
	node := d.node()
	first := drvKubelet(t, dir, "pod-first")
	if err := drvPublish(node, testenv.PublishRequest("vol-first", first, map[string]string{"reference": ref}), time.Minute); err != nil {
		t.Fatal(err)
	}
	d.kill()
	d.restart()
	node = d.node()
	publishes, failed := 0, 0
	for n := 0; n < 400; n++ {
		if d.metric("modelpack_cache_scrub_last_completion_timestamp_seconds") > 0 {
			break // the pass is over
		}
		target := drvKubelet(t, dir, fmt.Sprint("pod-", n))
		// A selection of its own: a new view, whose files are new links of the blobs.
		req := testenv.PublishRequest(fmt.Sprint("vol-", n), target, map[string]string{"reference": ref,
			"include": fmt.Sprintf("*.safetensors,config.json,unique-%d", n)})
		publishes++
		if err := drvPublish(node, req, time.Minute); err != nil {
			t.Errorf("publish %d during the scrub after an unclean restart: %v", n, err)
			failed++
			continue
		}
		if _, err := node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: req.VolumeId, TargetPath: target}); err != nil {
			t.Errorf("unpublish %d: %v", n, err)
		}
	}
	t.Logf("%d publishes during the scrub's pass, %d failed", publishes, failed)
	if publishes < 5 {
		t.Errorf("only %d publishes overlapped the scrub's pass", publishes)
	}
	if n := d.metric("modelpack_cache_corrupt_blobs_total"); n != 0 {
		t.Errorf("%v intact blobs called corrupt", n)
	}
	drvUnpublish(t, node, "vol-first", first)
}

// The driver's state files replaced, while it is down, by links to forged files elsewhere (or by files others may
// write) are set aside at its next start and not believed; the forged files are left as they are.
func TestDriverForgedStateFilesAreSetAside(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	testmodel.Push(t, reg.Host, "models/tiny", "v1", drvSmallModel("v1"), nil)
	d := drvStart(t, filepath.Join(dir, "node"), reg.Host)
	target := drvKubelet(t, dir, "pod")
	if err := drvPublish(d.node(), testenv.PublishRequest("vol", target, map[string]string{"reference": reg.Host + "/models/tiny:v1"}), time.Minute); err != nil {
		t.Fatal(err)
	}
	drvUnpublish(t, d.node(), "vol", target)
	d.stop()
	state := filepath.Join(d.Root, "csi")
	vols, err := filepath.Glob(filepath.Join(state, "volumes", "*.db"))
	if err != nil || len(vols) != 1 {
		t.Fatalf("this boot's volume records: %v %v", vols, err)
	}
	volumes, _ := filepath.Rel(state, vols[0])
	forged := filepath.Join(dir, "forged")
	os.Mkdir(forged, 0o755)
	files := []string{"access.key", "state.db", volumes}
	for _, name := range files {
		b, err := os.ReadFile(filepath.Join(state, name))
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(forged, filepath.Base(name))
		os.WriteFile(f, b, 0o644)
		os.Remove(filepath.Join(state, name))
		if name == volumes {
			// One of them a file others may write rather than a link.
			os.WriteFile(filepath.Join(state, name), b, 0o600)
			os.Chmod(filepath.Join(state, name), 0o666)
			continue
		}
		if err := os.Symlink(f, filepath.Join(state, name)); err != nil {
			t.Fatal(err)
		}
	}
	d.restart()
	for _, name := range files {
		// The files set aside are kept for inspection; this boot's volume records are dropped (package schema's
		// OpenVolatile keeps nothing else in their directory).
		if _, err := os.Lstat(filepath.Join(state, name+".corrupt")); err != nil && name != volumes {
			t.Errorf("%s not set aside: %v", name, err)
		}
		if fi, err := os.Lstat(filepath.Join(state, name)); err == nil && (fi.Mode()&os.ModeSymlink != 0 || fi.Mode().Perm()&0o022 != 0) {
			t.Errorf("%s still the forged one: %v", name, fi.Mode())
		}
	}
	if !strings.Contains(drvRead(t, d.log), "persisted state was unreadable and was set aside") {
		t.Error("setting the state aside is not logged")
	}
	// Still serving: the model mounts again (its access checked with the registry anew).
	if err := drvPublish(d.node(), testenv.PublishRequest("vol", target, map[string]string{"reference": reg.Host + "/models/tiny:v1"}), time.Minute); err != nil {
		t.Fatal(err)
	}
	drvUnpublish(t, d.node(), "vol", target)
}
