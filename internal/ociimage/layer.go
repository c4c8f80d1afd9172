// Package ociimage builds container images from host files without a container engine: a root-owned,
// uncompressed tar layer (entries in a fixed order, zero times, so the same files give the same digest).
package ociimage

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// WriteLayer writes a root-owned tar with the parent directories of every entry.
func WriteLayer(w io.Writer, files, dirs, links []string) error {
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

// FileLayer is an uncompressed tar layer backed by a file: digest and diff ID are the same hash.
type FileLayer struct {
	path string
	hash v1.Hash
	size int64
}

func NewFileLayer(path string) (*FileLayer, error) {
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
	return &FileLayer{path: path, size: n, hash: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}}, nil
}

func (l *FileLayer) Digest() (v1.Hash, error)             { return l.hash, nil }
func (l *FileLayer) DiffID() (v1.Hash, error)             { return l.hash, nil }
func (l *FileLayer) Compressed() (io.ReadCloser, error)   { return os.Open(l.path) }
func (l *FileLayer) Uncompressed() (io.ReadCloser, error) { return os.Open(l.path) }
func (l *FileLayer) Size() (int64, error)                 { return l.size, nil }
func (l *FileLayer) MediaType() (types.MediaType, error)  { return types.OCIUncompressedLayer, nil }

// Image is an OCI image of one layer for platform, with its entrypoint, command and labels; PATH is the usual one.
func Image(layer v1.Layer, platform v1.Platform, entrypoint, cmd []string, labels map[string]string) (v1.Image, error) {
	img, err := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), layer)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Variant = platform.OS, platform.Architecture, platform.Variant
	cfg.Config.Entrypoint = entrypoint
	cfg.Config.Cmd = cmd
	cfg.Config.Labels = labels
	cfg.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}
	return mutate.ConfigFile(img, cfg)
}
