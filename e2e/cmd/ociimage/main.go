// Command ociimage assembles a single-layer linux/amd64 OCI image from host files and pushes it, without a
// container engine: the local cluster's driver, registrar, busybox and pause images, and the benchmark's
// weights-as-an-image. The layer is an uncompressed tar, so multi-GiB weights are not gzipped on every run.
//
//	ociimage --file /usr/bin/busybox=/bin/busybox --link /bin/sh=busybox --entrypoint /bin/sh 127.0.0.1:5000/busybox:1
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/modelpack/modelpack/internal/ociimage"
)

type pairs []string

func (p *pairs) String() string     { return strings.Join(*p, ",") }
func (p *pairs) Set(s string) error { *p = append(*p, s); return nil }

func main() {
	var files, links, dirs pairs
	flag.Var(&files, "file", "HOSTPATH=IMAGEPATH: a regular file (mode kept), repeatable")
	flag.Var(&dirs, "dir", "HOSTDIR=IMAGEDIR: a directory tree, repeatable")
	flag.Var(&links, "link", "IMAGEPATH=TARGET: a symlink, repeatable")
	entrypoint := flag.String("entrypoint", "", "comma-separated entrypoint")
	cmd := flag.String("cmd", "", "comma-separated command")
	plainHTTP := flag.Bool("plain-http", true, "push over plain HTTP (the local registry)")
	libs := flag.Bool("libs", false, "also add the shared libraries (and the loader) every dynamically linked --file needs, at their host paths, as ldd resolves them")
	flag.Parse()
	if flag.NArg() != 1 {
		log.Fatal("usage: ociimage [flags] REFERENCE")
	}
	if *libs {
		extra, err := sharedLibs(files)
		if err != nil {
			log.Fatal(err)
		}
		files = append(files, extra...)
	}
	tmp, err := os.CreateTemp("", "ociimage-*.tar")
	if err != nil {
		log.Fatal(err)
	}
	defer os.Remove(tmp.Name())
	if err := ociimage.WriteLayer(tmp, files, dirs, links); err != nil {
		log.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		log.Fatal(err)
	}
	layer, err := ociimage.NewFileLayer(tmp.Name())
	if err != nil {
		log.Fatal(err)
	}
	img, err := ociimage.Image(layer, v1.Platform{OS: "linux", Architecture: "amd64"}, split(*entrypoint), split(*cmd), nil)
	if err != nil {
		log.Fatal(err)
	}
	var opts []name.Option
	if *plainHTTP {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.ParseReference(flag.Arg(0), opts...)
	if err != nil {
		log.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		log.Fatal(err)
	}
	d, _ := img.Digest()
	fmt.Printf("%s@%s\n", ref.Context(), d)
}

// sharedLibs lists, as HOSTPATH=IMAGEPATH pairs, the shared objects ldd resolves for the files given: Debian's
// programs (nginx) and cgo binaries (Kraken's, for sqlite) need them in an image that has no distribution in it.
// A static file is skipped; a library ldd cannot find is an error, as the program would not start.
func sharedLibs(files []string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, f := range files {
		src, _, _ := strings.Cut(f, "=")
		b, err := exec.Command("ldd", src).CombinedOutput()
		if err != nil {
			if strings.Contains(string(b), "not a dynamic executable") {
				continue
			}
			return nil, fmt.Errorf("ldd %s: %v: %s", src, err, b)
		}
		for _, line := range strings.Split(string(b), "\n") {
			// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)", "/lib64/ld-linux-x86-64.so.2 (0x…)", "linux-vdso.so.1 (0x…)"
			fields := strings.Fields(line)
			var lib string
			switch {
			case len(fields) >= 3 && fields[1] == "=>" && fields[2] == "not":
				return nil, fmt.Errorf("%s: %s not found by ldd", src, fields[0])
			case len(fields) >= 3 && fields[1] == "=>":
				lib = fields[2]
			case len(fields) >= 1 && strings.HasPrefix(fields[0], "/"):
				lib = fields[0]
			}
			if lib != "" && !seen[lib] {
				seen[lib] = true
				out = append(out, lib+"="+lib)
			}
		}
	}
	return out, nil
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
