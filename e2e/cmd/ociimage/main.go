// Command ociimage assembles a single-layer linux/amd64 OCI image from host files and pushes it, without a
// container engine: the local cluster's driver, registrar, busybox and pause images, and the benchmark's
// weights-as-an-image. The layer is an uncompressed tar, so multi-GiB weights are not gzipped on every run.
//
//	ociimage --file /usr/bin/busybox=/bin/busybox --link /bin/sh=busybox --entrypoint /bin/sh 127.0.0.1:5000/busybox:1
package main

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
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
	if err := writeLayer(tmp, files, dirs, links); err != nil {
		log.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		log.Fatal(err)
	}
	layer, err := newFileLayer(tmp.Name())
	if err != nil {
		log.Fatal(err)
	}
	img, err := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), layer)
	if err != nil {
		log.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		log.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config.Entrypoint = split(*entrypoint)
	cfg.Config.Cmd = split(*cmd)
	cfg.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
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

// writeLayer writes a root-owned tar with the parent directories of every entry.
func writeLayer(w io.Writer, files, dirs, links pairs) error {
	tw := tar.NewWriter(w)
	seen := map[string]bool{}
	var mkdirs func(string) error
	mkdirs = func(dir string) error {
		if dir == "." || dir == "/" || seen[dir] {
			return nil
		}
		if err := mkdirs(filepath.Dir(dir)); err != nil {
			return err
		}
		seen[dir] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755})
	}
	addFile := func(src, dst string) error {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if err := mkdirs(filepath.Dir(dst)); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: dst, Mode: int64(fi.Mode().Perm()), Size: fi.Size()}); err != nil {
			return err
		}
		_, err = io.Copy(tw, f)
		return err
	}
	for _, p := range files {
		src, dst, ok := strings.Cut(p, "=")
		if !ok {
			return fmt.Errorf("--file %q: want HOSTPATH=IMAGEPATH", p)
		}
		if err := addFile(src, strings.TrimPrefix(dst, "/")); err != nil {
			return err
		}
	}
	for _, p := range dirs {
		src, dst, ok := strings.Cut(p, "=")
		if !ok {
			return fmt.Errorf("--dir %q: want HOSTDIR=IMAGEDIR", p)
		}
		var paths []string
		if err := filepath.Walk(src, func(path string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				paths = append(paths, path)
			}
			return err
		}); err != nil {
			return err
		}
		sort.Strings(paths)
		for _, path := range paths {
			rel, _ := filepath.Rel(src, path)
			if err := addFile(path, filepath.Join(strings.TrimPrefix(dst, "/"), rel)); err != nil {
				return err
			}
		}
	}
	for _, p := range links {
		at, target, ok := strings.Cut(p, "=")
		if !ok {
			return fmt.Errorf("--link %q: want IMAGEPATH=TARGET", p)
		}
		at = strings.TrimPrefix(at, "/")
		if err := mkdirs(filepath.Dir(at)); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: at, Linkname: target, Mode: 0o777}); err != nil {
			return err
		}
	}
	return tw.Close()
}

// fileLayer is an uncompressed tar layer backed by a file: digest and diff ID are the same hash.
type fileLayer struct {
	path string
	hash v1.Hash
	size int64
}

func newFileLayer(path string) (*fileLayer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return nil, err
	}
	return &fileLayer{path: path, size: n, hash: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}}, nil
}

func (l *fileLayer) Digest() (v1.Hash, error)             { return l.hash, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)             { return l.hash, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)   { return os.Open(l.path) }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) { return os.Open(l.path) }
func (l *fileLayer) Size() (int64, error)                 { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error)  { return types.OCIUncompressedLayer, nil }
