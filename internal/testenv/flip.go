package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// FlipByte changes one byte of a file in place as an attacker or a careless operator would, with
// `dd conv=notrunc`: same size, same inode, so every hardlink of the file shows the change. With keepMtime the
// file's mtime is then put back with `touch -d`, so only its ctime tells of the write.
func FlipByte(t testing.TB, path string, off int64, keepMtime bool) {
	t.Helper()
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	_, err = f.ReadAt(b, off)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	dd := exec.Command("dd", "of="+path, "bs=1", fmt.Sprintf("seek=%d", off), "count=1", "conv=notrunc", "status=none")
	dd.Stdin = bytes.NewReader([]byte{b[0] ^ 0x5a})
	if out, err := dd.CombinedOutput(); err != nil {
		t.Fatalf("dd: %v: %s", err, out)
	}
	if !keepMtime {
		return
	}
	mt := before.ModTime()
	if out, err := exec.Command("touch", "-d", fmt.Sprintf("@%d.%09d", mt.Unix(), mt.Nanosecond()), path).CombinedOutput(); err != nil {
		t.Fatalf("touch: %v: %s", err, out)
	}
	if after, err := os.Stat(path); err != nil || !after.ModTime().Equal(mt) || after.Size() != before.Size() {
		t.Fatalf("touch -d did not put the mtime of %s back (%v)", path, err)
	}
}
