package cache

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/remote"
)

const helperEnv = "MODELPACK_CACHE_CRASH_HELPER"

// crashHelper runs in a subprocess (the test binary re-executed): it pulls and acquires one model, printing "ok".
// The parent kills it with SIGKILL at random points.
func crashHelper() int {
	var cfg struct {
		Root, Host, Repo string
		Desc             ocispec.Descriptor
	}
	cfg.Root, cfg.Host, cfg.Repo = os.Getenv("CRASH_ROOT"), os.Getenv("CRASH_HOST"), os.Getenv("CRASH_REPO")
	cfg.Desc = ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.Digest(os.Getenv("CRASH_DIGEST"))}
	fmt.Sscan(os.Getenv("CRASH_SIZE"), &cfg.Desc.Size)
	c, err := Open(Options{Root: cfg.Root})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	repo, _, err := remote.NewRepository(cfg.Host+"/"+cfg.Repo, remote.Options{PlainHTTP: true, RegistryConfig: filepath.Join(cfg.Root, "no-config.json")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	m, err := c.Pull(context.Background(), repo, cfg.Desc, nil)
	if err == nil {
		_, err = c.Acquire("crash", m.Digest, Selector{})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ok")
	return 0
}

// TestCrashDuringPull kills a pulling process at random points, five times, checking after each that the cache
// holds no corrupt blob and no half-built view; then a last run resumes and completes.
func TestCrashDuringPull(t *testing.T) {
	reg := startRegistry(t)
	px := newProxy(t, reg.Host)
	files := []modelFile{
		{Path: "model-00001-of-00003.safetensors", Data: shard(61, 3<<20)},
		{Path: "model-00002-of-00003.safetensors", Data: shard(62, 3<<20)},
		{Path: "model-00003-of-00003.safetensors", Data: shard(63, 3<<20)},
		{Path: "code", Data: makeTar(t, true, tarEntry{Name: "code/run.py", Body: strings.Repeat("x = 1\n", 50000)}), Kind: artifact.KindCode, Format: artifact.FormatTarGzip},
	}
	var total int64
	for _, f := range files {
		total += int64(len(f.Data))
	}
	desc := pushModel(t, newRepo(t, reg.Host, "models/crash"), "v1", files)
	root := t.TempDir()
	px.rate.Store(2 << 20) // each shard takes ~1.5 s from scratch: the five kills land mid-transfer
	run := func(kill time.Duration) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=1", "CRASH_ROOT="+root, "CRASH_HOST="+px.Host, "CRASH_REPO=models/crash",
			"CRASH_DIGEST="+desc.Digest.String(), fmt.Sprint("CRASH_SIZE=", desc.Size))
		out, err := cmd.StdoutPipe()
		if err != nil {
			return "", err
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			return "", err
		}
		if kill > 0 {
			time.AfterFunc(kill, func() { cmd.Process.Signal(syscall.SIGKILL) })
		}
		line, _ := bufio.NewReader(out).ReadString('\n')
		err = cmd.Wait()
		if err != nil && stderr.Len() > 0 {
			err = fmt.Errorf("%w: %s", err, stderr.String())
		}
		return strings.TrimSpace(line), err
	}
	sawPartial := false
	for i := range 5 {
		kill := time.Duration(50+rand.IntN(600)) * time.Millisecond
		line, err := run(kill)
		t.Logf("run %d killed after %v: %q %v", i, kill, line, err)
		// Whatever the kill interrupted, a restart finds no corrupt blob and no half-built view or layer.
		c, err := Open(Options{Root: root})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := c.Verify(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range rep.Problems {
			if !strings.Contains(p.What, "not extracted") {
				t.Errorf("after kill %d: %s: %s", i, p.Digest, p.What)
			}
		}
		u, _ := c.Usage()
		sawPartial = sawPartial || u.Partials > 0
		c.Close()
		for _, d := range []string{"tmp", "trash"} {
			if entries, _ := os.ReadDir(root + "/" + d); len(entries) != 0 {
				t.Errorf("after kill %d: %s holds %d entries after recovery", i, d, len(entries))
			}
		}
	}
	// A last, uninterrupted run completes, fetching only what is missing.
	c, err := Open(Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := c.Usage()
	c.Close()
	have := u.Blobs + u.Partials
	px.reset()
	px.rate.Store(0)
	line, err := run(0)
	if err != nil || line != "ok" {
		t.Fatalf("final run: %q %v", line, err)
	}
	moved := px.blobBytes()
	t.Logf("final run moved %d of %d layer bytes; %d were already on disk (partials seen: %v)", moved, total, have, sawPartial)
	if moved > total-have+int64(len(files))*(1<<20)+64<<10 {
		t.Errorf("final run moved %d bytes: the earlier work was not resumed", moved)
	}
	c, err = Open(Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if rep, err := c.Verify(context.Background()); err != nil || len(rep.Problems) != 0 {
		t.Fatalf("verify: %+v %v", rep, err)
	}
	dir, err := c.Acquire("check", desc.Digest, Selector{})
	if err != nil {
		t.Fatal(err)
	}
	tree := listTree(t, dir)
	if len(tree) != 5 || !slices.ContainsFunc(tree, func(s string) bool { return strings.HasPrefix(s, "code/run.py file 444") }) {
		t.Errorf("view after recovery: %v", tree)
	}
}
