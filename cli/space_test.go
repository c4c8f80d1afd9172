package cli

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Item: fetch and unpack into a directory, and pull into a store, whose file system cannot hold what is still to
// write fail at once, with both numbers and the path, and write nothing; what fits (a --include of the small file)
// still goes.
func TestWriteRefusedWhenTheDiskIsTooSmall(t *testing.T) {
	disk := testenv.SmallDisk(t, "256k")
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir())
	model := t.TempDir()
	weights := make([]byte, 1<<20)
	rand.Read(weights)
	cfg := []byte(`{"architectures":["LlamaForCausalLM"]}`)
	if err := os.WriteFile(filepath.Join(model, "weights.bin"), weights, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(model, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	ref := reg.Host + "/space/model:v1"
	if code, _, stderr := run("--home", home, "pack", model, "-t", ref); code != 0 {
		t.Fatalf("pack: exit %d: %s", code, stderr)
	}
	if code, _, stderr := run("--home", home, "push", "--plain-http", ref); code != 0 {
		t.Fatalf("push: exit %d: %s", code, stderr)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(disk, &st); err != nil {
		t.Fatal(err)
	}
	free, need := int64(st.Bavail)*st.Bsize, len(weights)+len(cfg)
	for name, args := range map[string][]string{
		"fetch":  {"fetch", "--plain-http", ref},
		"unpack": {"--home", home, "unpack", ref},
	} {
		dst := filepath.Join(disk, name, "out")
		code, _, stderr := run(append(args, dst)...)
		want := fmt.Sprintf("%s: %s (%d bytes) to write, more than the %s (%d bytes) free on the file system of %s; nothing was written",
			dst, humanBytes(int64(need)), need, humanBytes(free), free, disk)
		if code != 1 || !strings.Contains(stderr, want) {
			t.Fatalf("%s onto a %d-byte disk: exit %d: %s\nwant exit 1 and %q", name, free, code, stderr, want)
		}
		if entries, err := os.ReadDir(disk); err != nil || len(entries) != 0 {
			t.Fatalf("%s refused but wrote %v (%v)", name, entries, err)
		}
	}
	// pull: the blobs its store lacks (the layers, and the config counted in need) must fit there; none is
	// written (opening the store writes its small metadata first, so the free space is no longer the disk's; the
	// config blob adds to the files' bytes).
	storeHome := filepath.Join(disk, "home")
	code, _, stderr := run("--home", storeHome, "pull", "--plain-http", ref)
	if code != 1 || !strings.Contains(stderr, fmt.Sprintf("free on the file system of %s; nothing was written (free space there, or give --home another directory)", storeHome)) ||
		!regexp.MustCompile(regexp.QuoteMeta(storeHome)+`: 1\.0 MiB \(10488\d\d bytes\) to write, more than the \d+ KiB \(\d+ bytes\) free`).MatchString(stderr) {
		t.Fatalf("pull into a store on a %d-byte disk: exit %d: %s", free, code, stderr)
	}
	filepath.WalkDir(disk, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && strings.Contains(p, "blobs") {
			t.Errorf("pull refused but wrote %s", p)
		}
		return nil
	})
	os.RemoveAll(storeHome)
	dst := filepath.Join(disk, "cfg")
	if code, _, stderr := run("fetch", "--plain-http", ref, dst, "--include", "config.json"); code != 0 {
		t.Fatalf("fetch of what fits: exit %d: %s", code, stderr)
	}
	if got, err := os.ReadFile(filepath.Join(dst, "config.json")); err != nil || string(got) != string(cfg) {
		t.Fatalf("fetched config.json: %q, %v", got, err)
	}
}
