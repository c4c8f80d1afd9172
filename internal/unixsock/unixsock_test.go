package unixsock

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

const nobody = 65534

func mode(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode()
}

// The socket is 0600 under any umask, the process's own included: bound where nobody else can reach it and
// renamed into place.
func TestSocketIsTheOwnersAloneWhateverTheUmask(t *testing.T) {
	for _, umask := range []int{0, 0o002, 0o077} {
		dir := filepath.Join(t.TempDir(), "plugin")
		old := syscall.Umask(umask)
		l, err := Listen(filepath.Join(dir, "csi.sock"), nil)
		syscall.Umask(old)
		if err != nil {
			t.Fatal(err)
		}
		if m := mode(t, filepath.Join(dir, "csi.sock")); m&os.ModeSocket == 0 || m.Perm() != Mode {
			t.Errorf("umask %03o: socket mode %v, want a socket %04o", umask, m, Mode)
		}
		if m := mode(t, dir); m.Perm()&0o022 != 0 {
			t.Errorf("umask %03o: created directory mode %v, writable by others", umask, m)
		}
		if got := l.Addr().String(); got != filepath.Join(dir, "csi.sock") {
			t.Errorf("Addr %s", got)
		}
		l.Close()
		if _, err := os.Lstat(filepath.Join(dir, "csi.sock")); !os.IsNotExist(err) {
			t.Errorf("socket left after Close: %v", err)
		}
		if ents, _ := filepath.Glob(filepath.Join(dir, ".sock-*")); len(ents) != 0 {
			t.Errorf("private bind directories left: %v", ents)
		}
	}
}

// A user other than the owner cannot connect: a real connect(2) from a process running as nobody.
func TestNobodyCannotConnect(t *testing.T) {
	testenv.RequireRoot(t)
	base := t.TempDir()
	os.Chmod(filepath.Dir(base), 0o755)
	os.Chmod(base, 0o755)
	sock := filepath.Join(base, "csi.sock")
	old := syscall.Umask(0)
	l, err := Listen(sock, nil)
	syscall.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// This test binary, copied where nobody may run it, connects as nobody (TestHelperConnect).
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "client")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestHelperConnect$")
	cmd.Env = []string{"UNIXSOCK_CONNECT=" + sock}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "connect: permission denied") {
		t.Fatalf("nobody connecting: %v\n%s", err, out)
	}
}

// TestHelperConnect is the client TestNobodyCannotConnect runs as nobody.
func TestHelperConnect(t *testing.T) {
	sock := os.Getenv("UNIXSOCK_CONNECT")
	if sock == "" {
		return // only run by TestNobodyCannotConnect
	}
	c, err := net.Dial("unix", sock)
	if err == nil {
		c.Close()
		t.Fatal("CONNECTED")
	}
	fmt.Println(err)
}

// What is already at the name: a stale socket of the owner is replaced; a live one, one of another user, a file or
// a link is refused and left in place.
func TestExistingEntries(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "prepull.sock")

	// Stale: a listener that stopped without removing its name (a killed driver).
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	l, err := Listen(sock, nil)
	if err != nil {
		t.Fatalf("stale socket of ours: %v", err)
	}

	// Live: a second Listen (a second driver) is refused and the first's socket still answers.
	if _, err := Listen(sock, nil); err == nil || !strings.Contains(err.Error(), "another process serves") {
		t.Fatalf("second listener on a live socket: %v", err)
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("the first socket was taken away: %v", err)
	}
	c.Close()
	l.Close()

	// Live, served by something that is not us (no lock held): refused after a connect.
	other, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(sock, nil); err == nil || !strings.Contains(err.Error(), "another process serves") {
		t.Fatalf("listener on a socket another program serves: %v", err)
	}
	other.Close()

	// Another user's stale socket.
	foreign, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	foreign.SetUnlinkOnClose(false)
	foreign.Close()
	if err := os.Lchown(sock, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(sock, nil); err == nil || !strings.Contains(err.Error(), "uid 65534") {
		t.Fatalf("stale socket of another user: %v", err)
	}
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("another user's socket was removed: %v", err)
	}
	os.Remove(sock)

	// A link and a regular file.
	os.Symlink(filepath.Join(t.TempDir(), "elsewhere"), sock)
	if _, err := Listen(sock, nil); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("symlink at the name: %v", err)
	}
	os.Remove(sock)
	os.WriteFile(sock, []byte("x"), 0o600)
	if _, err := Listen(sock, nil); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("file at the name: %v", err)
	}
	if b, _ := os.ReadFile(sock); string(b) != "x" {
		t.Fatal("the file at the name was replaced")
	}
}

// The socket's directory: one of ours open to others is fixed before its entries are looked at; a sticky shared
// one, one of another user, or one below a directory others can write to is refused.
func TestSocketDirectory(t *testing.T) {
	testenv.RequireRoot(t)
	base := t.TempDir()
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o755)
	os.Chmod(open, 0o777)
	l, err := Listen(filepath.Join(open, "csi.sock"), nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if m := mode(t, open).Perm(); m != 0o755 {
		t.Errorf("0777 socket directory is now %04o, want 0755", m)
	}

	sticky := filepath.Join(base, "sticky")
	os.Mkdir(sticky, 0o755)
	os.Chmod(sticky, os.ModeSticky|0o777)
	if _, err := Listen(filepath.Join(sticky, "csi.sock"), nil); err == nil || !strings.Contains(err.Error(), "shared") {
		t.Errorf("sticky shared directory: %v", err)
	}

	foreign := filepath.Join(base, "foreign")
	os.Mkdir(foreign, 0o755)
	os.Chown(foreign, nobody, nobody)
	if _, err := Listen(filepath.Join(foreign, "csi.sock"), nil); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Errorf("directory of another user: %v", err)
	}

	above := filepath.Join(base, "above")
	os.MkdirAll(filepath.Join(above, "plugin"), 0o755)
	os.Chmod(above, 0o777)
	if _, err := Listen(filepath.Join(above, "plugin", "csi.sock"), nil); err == nil || !strings.Contains(err.Error(), "above the socket") {
		t.Errorf("directory below one others can write to: %v", err)
	}

	// A good directory reached through a link that sits in a directory others can write to (and so replace).
	good := filepath.Join(base, "good")
	os.Mkdir(good, 0o755)
	if err := os.Symlink(good, filepath.Join(above, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(filepath.Join(above, "link", "csi.sock"), nil); err == nil || !strings.Contains(err.Error(), "above the socket") {
		t.Errorf("directory reached through a link others can replace: %v", err)
	}
	l, err = Listen(filepath.Join(good, "csi.sock"), nil)
	if err != nil {
		t.Fatalf("the same directory named directly: %v", err)
	}
	l.Close()
}

// A socket name that fits an address but whose private bind name would not is still served.
func TestLongPath(t *testing.T) {
	dir := t.TempDir()
	long := filepath.Join(dir, strings.Repeat("d", maxPath-len(dir)-len("/x.sock")-2))
	if err := os.Mkdir(long, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(long, "x.sock")
	l, err := Listen(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if m := mode(t, sock); m&os.ModeSocket == 0 || m.Perm() != Mode {
		t.Fatalf("mode %v", m)
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := Listen(sock+"-and-then-some", nil); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("a name too long: %v", err)
	}
}
