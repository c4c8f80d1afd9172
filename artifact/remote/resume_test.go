package remote

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelpack/modelpack/internal/testenv"
)

// slack is what a proxy may have read from the registry but not delivered when the registry died.
const slack = 8 << 20

func TestPullResumesAfterRegistryRestart(t *testing.T) {
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	opts := Options{PlainHTTP: true, RegistryConfig: filepath.Join(t.TempDir(), "config.json")}
	m := buildModel(t, 40<<20)
	if _, err := Push(ctx, m.store, m.ref, repoFor(t, reg.Host+"/r/model:v1", opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	p := newCountingProxy(t, reg.Host)
	p.delay.Store(int64(4 * time.Millisecond))
	p.onBytes = 8 << 20

	local := newCASStore(t)
	done := make(chan error, 1)
	go func() {
		_, err := Pull(ctx, repoFor(t, p.host()+"/r/model:v1", opts), local, "model:v1", TransferOptions{})
		done <- err
	}()
	select {
	case <-p.fire:
	case err := <-done:
		t.Fatalf("pull ended before the registry was stopped: %v", err)
	}
	reg.Stop()
	time.Sleep(time.Second)
	reg.Restart()
	if err := <-done; err != nil {
		t.Fatalf("pull across a registry restart: %v", err)
	}
	for _, b := range append(m.blobs, m.desc) {
		if !local.has(t, b) {
			t.Fatalf("blob %s missing after the pull", b.Digest)
		}
	}
	if p.ranges.Load() == 0 {
		t.Fatal("no Range request: the download started over")
	}
	if got, max := p.blobBytes.Load(), m.layerBytes()+slack; got > max {
		t.Fatalf("the registry sent %d blob bytes for %d, more than a resumed transfer would (%d)", got, m.layerBytes(), max)
	}
	t.Logf("blob bytes sent %d for %d bytes of blobs, %d range requests", p.blobBytes.Load(), m.layerBytes(), p.ranges.Load())
}

func TestPullResumesPartialFromEarlierRun(t *testing.T) {
	reg, opts := plainRegistry(t)
	m := buildModel(t, 32<<20)
	if _, err := Push(context.Background(), m.store, m.ref, repoFor(t, reg.Host+"/r/model:v1", opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	p := newCountingProxy(t, reg.Host)
	p.delay.Store(int64(4 * time.Millisecond))
	p.onBytes = 8 << 20
	local := newCASStore(t)

	// The first run is interrupted (as by Ctrl-C or a killed pod).
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Pull(ctx, repoFor(t, p.host()+"/r/model:v1", opts), local, "model:v1", TransferOptions{Concurrency: 1})
		done <- err
	}()
	<-p.fire
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted pull: %v, want context.Canceled", err)
	}
	partials, err := local.Partials()
	if err != nil {
		t.Fatal(err)
	}
	var held int64
	for _, n := range partials {
		held += n
	}
	if held < 4<<20 {
		t.Fatalf("the interrupted pull kept %d bytes of partials, want the bytes it had", held)
	}
	sentBefore := p.blobBytes.Load()

	// The second run resumes from the partial.
	p.delay.Store(0)
	rec := newRecorder()
	res, err := Pull(context.Background(), repoFor(t, p.host()+"/r/model:v1", opts), local, "model:v1", TransferOptions{Reporter: rec})
	if err != nil {
		t.Fatal(err)
	}
	var resumedAt int64
	for _, n := range rec.starts {
		resumedAt += n
	}
	if resumedAt < held {
		t.Fatalf("the second pull started blobs at %d bytes in total, want at least the %d held", resumedAt, held)
	}
	if res.Transferred > m.layerBytes()-held+slack/8 {
		t.Fatalf("the second pull transferred %d bytes; %d of %d were already held", res.Transferred, held, m.layerBytes())
	}
	if total := p.blobBytes.Load(); total > m.layerBytes()+slack {
		t.Fatalf("blob bytes sent over both runs %d (before: %d), want about %d", total, sentBefore, m.layerBytes())
	}
}

func TestCorruptBlobIsRejectedAndDropped(t *testing.T) {
	ctx := context.Background()
	reg, opts := plainRegistry(t)
	m := buildModel(t, 2<<20)
	if _, err := Push(ctx, m.store, m.ref, repoFor(t, reg.Host+"/c/model:v1", opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	victim := m.blobs[0]
	f, err := os.OpenFile(reg.BlobPath(victim.Digest.String()), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("corrupted!"), 1<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()

	local := newCASStore(t)
	_, err = Pull(ctx, repoFor(t, reg.Host+"/c/model:v1", opts), local, "model:v1", TransferOptions{})
	if Classify(err) != ErrDigestMismatch || !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("pull of a corrupted blob: %v, want a digest mismatch", err)
	}
	t.Log(err)
	if local.has(t, victim) {
		t.Fatal("the corrupted blob was stored")
	}
	partials, _ := local.Partials()
	if n, ok := partials[victim.Digest]; ok {
		t.Fatalf("%d bytes of the corrupted blob were kept as a partial", n)
	}

	dir := t.TempDir()
	_, err = Fetch(ctx, repoFor(t, reg.Host+"/c/model:v1", opts), dir, FetchOptions{})
	if Classify(err) != ErrDigestMismatch {
		t.Fatalf("fetch of a corrupted blob: %v, want a digest mismatch", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "model-00001-of-00002.safetensors")); !os.IsNotExist(err) {
		t.Fatalf("the corrupted file exists under its final name: %v", err)
	}
	assertNoStaging(t, dir)
}

func TestPushRetriesFailedUploads(t *testing.T) {
	ctx := context.Background()
	reg, opts := plainRegistry(t)
	p := newCountingProxy(t, reg.Host)
	// Every upload URL fails a few times; PUTs carry a body that cannot be replayed, so the blob-level retry runs.
	p.failPaths["/blobs/uploads/"] = 8
	m := buildModel(t, 1<<20)
	res, err := Push(ctx, m.store, m.ref, repoFor(t, p.host()+"/p/model:v1", opts), TransferOptions{})
	if err != nil {
		t.Fatalf("push through failing uploads: %v", err)
	}
	if res.Descriptor.Digest != m.desc.Digest {
		t.Fatalf("pushed %s, want %s", res.Descriptor.Digest, m.desc.Digest)
	}
	dir := t.TempDir()
	if _, err := Fetch(ctx, repoFor(t, reg.Host+"/p/model:v1", opts), dir, FetchOptions{}); err != nil {
		t.Fatal(err)
	}
	m.checkFiles(t, dir)
}

func TestStalledDownloadResumes(t *testing.T) {
	reg, opts := plainRegistry(t)
	opts.Timeouts.Idle = 500 * time.Millisecond
	m := buildModel(t, 8<<20)
	if _, err := Push(context.Background(), m.store, m.ref, repoFor(t, reg.Host+"/s/model:v1", opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	p := newCountingProxy(t, reg.Host)
	p.stallAfter = 1 << 20
	dir := t.TempDir()
	start := time.Now()
	if _, err := Fetch(context.Background(), repoFor(t, p.host()+"/s/model:v1", opts), dir, FetchOptions{}); err != nil {
		t.Fatalf("fetch through a stalling connection: %v", err)
	}
	m.checkFiles(t, dir)
	if !p.stalled.Load() || p.ranges.Load() == 0 {
		t.Fatalf("stalled %v, range requests %d: the stall was not resumed with Range", p.stalled.Load(), p.ranges.Load())
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("fetch took %v: the stall was not detected", d)
	}
}

func TestNoSpaceIsReported(t *testing.T) {
	testenv.RequireRoot(t)
	reg, opts := plainRegistry(t)
	m := buildModel(t, 4<<20)
	if _, err := Push(context.Background(), m.store, m.ref, repoFor(t, reg.Host+"/n/model:v1", opts), TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", dir).CombinedOutput(); err != nil {
		testenv.Unavailable(t, "cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	_, err := Fetch(context.Background(), repoFor(t, reg.Host+"/n/model:v1", opts), dir, FetchOptions{})
	if Classify(err) != ErrNoSpace || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("fetch into a full disk: %v, want ErrNoSpace", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "model-00001-of-00002.safetensors")); !os.IsNotExist(err) {
		t.Fatalf("a partial file is under its final name: %v", err)
	}
	assertNoStaging(t, dir)
}
