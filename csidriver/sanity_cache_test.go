package csidriver_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/cache"
	"github.com/modelpack/modelpack/csidriver"
	"github.com/modelpack/modelpack/csidriver/cachebackend"
	"github.com/modelpack/modelpack/internal/testenv"
)

// startCacheDriver runs the driver on the real node cache, reaching registries over plain HTTP.
func startCacheDriver(t *testing.T, dir string, plainHTTP ...string) string {
	t.Helper()
	sock, _ := startCacheDriverWith(t, dir, cache.Options{}, nil, plainHTTP...)
	return sock
}

// startCacheDriverWith is startCacheDriver with cache options (Root and VolatileOwnerPrefix are set here) and a
// trust-policy verifier (nil for none); it returns the cache too.
func startCacheDriverWith(t *testing.T, dir string, copts cache.Options, verifier cachebackend.Verifier, plainHTTP ...string) (string, *cache.Cache) {
	t.Helper()
	copts.Root, copts.VolatileOwnerPrefix = filepath.Join(dir, "cache"), csidriver.OwnerPrefix
	c, err := cache.Open(copts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cfg := testenv.EmptyDockerConfig(t)
	sock := filepath.Join(dir, "csi.sock")
	d, err := csidriver.New(csidriver.Options{
		NodeID:   "sanity-node",
		Endpoint: "unix://" + sock,
		StateDir: filepath.Join(dir, "state"),
		Backend: cachebackend.New(c, cachebackend.Options{Verifier: verifier,
			Remote: remote.Options{RegistryConfig: cfg, PlainHTTPHosts: plainHTTP}}),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			return sock, c
		}
		if time.Since(start) > 10*time.Second {
			t.Fatal("driver socket did not appear")
		}
	}
}

// orasPush pushes files from dir with oras, the way a generic OCI tool publishes a model.
func orasPush(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(testenv.Tool(t, "oras"), append([]string{"push", "--plain-http", "--disable-path-validation"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("oras push %v: %v\n%s", args, err, out)
	}
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSanityWithCache runs csi-sanity on the driver backed by the real node cache and a real registry: every
// NodePublishVolume the suite makes pulls and mounts a ModelPack artifact.
func TestSanityWithCache(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	csidriver.CleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	src := filepath.Join(dir, "src")
	os.MkdirAll(src, 0o755)
	writeFiles(t, src, map[string]string{
		"model.safetensors": "weights",
		"config.json":       `{"hidden_size": 8}`,
		"model-config.json": `{"descriptor":{"name":"sanity"},"config":{"format":"safetensors"},"modelfs":{"type":"layers","diffIds":["sha256:0000000000000000000000000000000000000000000000000000000000000000"]}}`,
	})
	ref := reg.Host + "/models/sanity:v1"
	orasPush(t, src, "--artifact-type", "application/vnd.cncf.model.manifest.v1+json",
		"--config", "model-config.json:application/vnd.cncf.model.config.v1+json", ref,
		"model.safetensors:application/vnd.cncf.model.weight.v1.raw", "config.json:application/vnd.cncf.model.weight.config.v1.raw")
	sock := startCacheDriver(t, filepath.Join(dir, "node"), reg.Host)
	csidriver.RunSanity(t, dir, sock, "reference: "+ref+"\npullPolicy: Always\n")
}

// TestPlatformPicksManifestOfIndex mounts the manifest of a multi-platform index that the volume's platform
// attribute names, whatever the node's own platform.
func TestPlatformPicksManifestOfIndex(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	csidriver.CleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	src := filepath.Join(dir, "src")
	os.MkdirAll(src, 0o755)
	repo := reg.Host + "/models/multi"
	for _, arch := range []string{"amd64", "arm64"} {
		writeFiles(t, src, map[string]string{"arch.txt": arch})
		orasPush(t, src, "--artifact-platform", "linux/"+arch, repo+":linux-"+arch, "arch.txt:application/vnd.cncf.model.weight.v1.raw")
	}
	cmd := exec.Command(testenv.Tool(t, "oras"), "manifest", "index", "create", "--plain-http", repo+":multi", "linux-amd64", "linux-arm64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("oras manifest index create: %v\n%s", err, out)
	}
	sock := startCacheDriver(t, filepath.Join(dir, "node"), reg.Host)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	node := csi.NewNodeClient(conn)
	for _, arch := range []string{"arm64", "amd64"} {
		parent := filepath.Join(dir, "pods", arch)
		os.MkdirAll(parent, 0o755)
		target := filepath.Join(parent, "mount")
		_, err := node.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{
			VolumeId:      "v-" + arch,
			TargetPath:    target,
			VolumeContext: map[string]string{"reference": repo + ":multi", "platform": "linux/" + arch},
			VolumeCapability: &csi.VolumeCapability{
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
			},
		})
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		got, err := os.ReadFile(filepath.Join(target, "arch.txt"))
		if err != nil || string(got) != arch {
			t.Fatalf("platform linux/%s mounted %q (%v)", arch, got, err)
		}
		if _, err := node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "v-" + arch, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
	}
}
