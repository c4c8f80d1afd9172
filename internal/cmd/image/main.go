// Command image builds the modelpack image — the CLI, CSI driver and prepull watcher in one static binary — for
// several platforms as one OCI image index, without a container engine: each platform's binary is cross-compiled
// (CGO_ENABLED=0, GOOS/GOARCH), put in a layer with the build host's CA bundle, and the images are indexed by
// platform. `make image` runs it. The output is an OCI image layout (--layout DIR, tagged VERSION) or a push to a
// registry (a reference argument); loopback registries are plain HTTP, others use the docker credential store.
//
//	go run ./internal/cmd/image --version v0.1.0 --layout bin/image
//	go run ./internal/cmd/image --version v0.1.0 registry.example.com/modelpack/modelpack:v0.1.0
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/modelpack/modelpack/internal/ociimage"
)

func main() {
	version := flag.String("version", "dev", "the version stamped into the binary and the image's labels and layout tag")
	revision := flag.String("revision", "", "the commit stamped into the binary and the image's labels")
	platforms := flag.String("platforms", "linux/amd64,linux/arm64", "comma-separated OS/ARCH list")
	layoutDir := flag.String("layout", "", "write an OCI image layout here (replacing its index) instead of pushing")
	caBundle := flag.String("ca-bundle", "/etc/ssl/certs/ca-certificates.crt", "the CA bundle put at /etc/ssl/certs/ca-certificates.crt")
	flag.Parse()
	if (*layoutDir == "") == (flag.NArg() != 1) {
		log.Fatal("usage: image [--version V] [--platforms linux/amd64,linux/arm64] (--layout DIR | REFERENCE)")
	}
	tmp, err := os.MkdirTemp("", "modelpack-image-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	idx, err := build(tmp, *version, *revision, strings.Split(*platforms, ","), *caBundle)
	if err != nil {
		os.RemoveAll(tmp)
		log.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil {
		log.Fatal(err)
	}
	if *layoutDir != "" {
		// A fresh layout each time: the index lists this build only, tagged as oras and skopeo name layout tags.
		if err := os.RemoveAll(*layoutDir); err != nil {
			log.Fatal(err)
		}
		p, err := layout.Write(*layoutDir, empty.Index)
		if err != nil {
			log.Fatal(err)
		}
		if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": *version})); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s:%s@%s\n", *layoutDir, *version, d)
		return
	}
	ref, err := name.ParseReference(flag.Arg(0))
	if err != nil {
		log.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s@%s\n", ref.Context(), d)
}

// build cross-compiles the binary for each platform and indexes the images.
func build(tmp, version, revision string, platforms []string, caBundle string) (v1.ImageIndex, error) {
	labels := map[string]string{
		"org.opencontainers.image.title":   "modelpack",
		"org.opencontainers.image.source":  "https://github.com/modelpack/modelpack",
		"org.opencontainers.image.version": version,
	}
	if revision != "" {
		labels["org.opencontainers.image.revision"] = strings.TrimSuffix(revision, "-dirty")
	}
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, pl := range platforms {
		osName, arch, ok := strings.Cut(strings.TrimSpace(pl), "/")
		if !ok || osName != "linux" || arch == "" {
			return nil, fmt.Errorf("--platforms %q: want linux/ARCH entries, e.g. linux/amd64,linux/arm64", pl)
		}
		bin := filepath.Join(tmp, arch, "modelpack")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags",
			"-s -w -X github.com/modelpack/modelpack/cli.Version="+version+" -X github.com/modelpack/modelpack/cli.Revision="+revision,
			"-o", bin, "github.com/modelpack/modelpack/cli/modelpack")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("go build for %s: %w", pl, err)
		}
		tarPath := filepath.Join(tmp, arch, "layer.tar")
		f, err := os.Create(tarPath)
		if err != nil {
			return nil, err
		}
		// Nothing but the binary and the CA bundle: the driver mounts and unmounts by system calls and execs
		// nothing, so the image needs no shell, libc or mount(8).
		err = ociimage.WriteLayer(f, []string{bin + "=/usr/local/bin/modelpack", caBundle + "=/etc/ssl/certs/ca-certificates.crt"}, nil, nil)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		layer, err := ociimage.NewFileLayer(tarPath)
		if err != nil {
			return nil, err
		}
		platform := v1.Platform{OS: osName, Architecture: arch}
		img, err := ociimage.Image(layer, platform, []string{"/usr/local/bin/modelpack"}, []string{"--help"}, labels)
		if err != nil {
			return nil, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &platform}})
	}
	return idx, nil
}
