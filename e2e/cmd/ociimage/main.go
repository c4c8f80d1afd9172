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
	flag.Parse()
	if flag.NArg() != 1 {
		log.Fatal("usage: ociimage [flags] REFERENCE")
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

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
