package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Item 32.9: `make image`'s builder writes one OCI index for linux/amd64 and linux/arm64 that the real oras reads
// from the layout and the real crane pushes to a real registry and reads back per platform; each platform's
// config names its architecture and the binary is that architecture's.
func TestImageIndexBothPlatforms(t *testing.T) {
	oras, crane := testenv.Tool(t, "oras"), testenv.Tool(t, "crane")
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	dir := filepath.Join(t.TempDir(), "image")
	build := exec.Command("go", "run", "./internal/cmd/image", "--version", "v9.8.7", "--revision", "abc123", "--layout", dir)
	build.Dir = testenv.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("image: %v\n%s", err, out)
	}
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, stderr)
		}
		return string(out)
	}
	var idx struct {
		MediaType string
		Manifests []struct {
			Platform struct{ OS, Architecture string }
		}
	}
	if err := json.Unmarshal([]byte(run(oras, "manifest", "fetch", "--oci-layout", dir+":v9.8.7")), &idx); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range idx.Manifests {
		got = append(got, m.Platform.OS+"/"+m.Platform.Architecture)
	}
	if idx.MediaType != "application/vnd.oci.image.index.v1+json" || strings.Join(got, ",") != "linux/amd64,linux/arm64" {
		t.Fatalf("index %s with platforms %v, want an OCI index of linux/amd64,linux/arm64", idx.MediaType, got)
	}
	ref := reg.Host + "/modelpack/modelpack:v9.8.7"
	run(crane, "push", dir, ref)
	for _, arch := range []string{"amd64", "arm64"} {
		var cfg struct {
			Architecture, OS string
			Config           struct {
				Entrypoint []string
				Labels     map[string]string
			}
		}
		if err := json.Unmarshal([]byte(run(crane, "config", "--platform", "linux/"+arch, ref)), &cfg); err != nil {
			t.Fatal(err)
		}
		if cfg.Architecture != arch || cfg.OS != "linux" || strings.Join(cfg.Config.Entrypoint, " ") != "/usr/local/bin/modelpack" ||
			cfg.Config.Labels["org.opencontainers.image.version"] != "v9.8.7" || cfg.Config.Labels["org.opencontainers.image.revision"] != "abc123" {
			t.Errorf("linux/%s config: %+v", arch, cfg)
		}
		// The layer holds the binary and the CA bundle and nothing else.
		layerDir := t.TempDir()
		tarPath := filepath.Join(layerDir, "fs.tar")
		run(crane, "export", "--platform", "linux/"+arch, ref, tarPath)
		list := run("tar", "-tf", tarPath)
		if !strings.Contains(list, "usr/local/bin/modelpack") || !strings.Contains(list, "etc/ssl/certs/ca-certificates.crt") {
			t.Errorf("linux/%s files:\n%s", arch, list)
		}
		run("tar", "-xf", tarPath, "-C", layerDir, "usr/local/bin/modelpack")
		f, err := os.ReadFile(filepath.Join(layerDir, "usr/local/bin/modelpack"))
		if err != nil || len(f) < 20 {
			t.Fatalf("binary: %v", err)
		}
		// ELF e_machine: 62 x86-64, 183 AArch64.
		machine := map[string]int{"amd64": 62, "arm64": 183}[arch]
		if int(f[18])|int(f[19])<<8 != machine {
			t.Errorf("linux/%s binary has e_machine %d, want %d", arch, int(f[18])|int(f[19])<<8, machine)
		}
	}
	// Pushed by the builder itself (make image IMAGE=…), to a loopback registry in plain HTTP.
	push := exec.Command("go", "run", "./internal/cmd/image", "--version", "v9.8.7", "--platforms", "linux/amd64", reg.Host+"/modelpack/modelpack:pushed")
	push.Dir = testenv.RepoRoot()
	if out, err := push.CombinedOutput(); err != nil {
		t.Fatalf("image push: %v\n%s", err, out)
	}
	if out := run(crane, "manifest", reg.Host+"/modelpack/modelpack:pushed"); !strings.Contains(out, `"architecture":"amd64"`) || !strings.Contains(out, "image.index") {
		t.Errorf("pushed index: %s", out)
	}
	// The host's platform runs and says the stamped version.
	bin := filepath.Join(t.TempDir(), "modelpack")
	tarPath := filepath.Join(t.TempDir(), "fs.tar")
	run(crane, "export", "--platform", "linux/amd64", ref, tarPath)
	run("tar", "-xf", tarPath, "-C", filepath.Dir(bin), "--strip-components=3", "usr/local/bin/modelpack")
	if out := run(bin, "version"); !strings.Contains(out, "v9.8.7") || !strings.Contains(out, "abc123") {
		t.Errorf("version in the image: %q", out)
	}
}
