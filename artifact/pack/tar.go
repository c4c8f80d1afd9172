package pack

import (
	"archive/tar"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/artifact"
)

// writeArchive writes the layer as a reproducible archive: entries in lexical order with model-relative names,
// permission bits only, uid/gid 0, no user or group names, one fixed mtime and no platform metadata. The
// compressors run single-threaded with fixed settings, so their output is a function of the tar alone.
func (w *layerWriter) writeArchive(out io.Writer) (err error) {
	var compressor io.WriteCloser
	switch w.plan.format {
	case artifact.FormatTar:
	case artifact.FormatTarGzip:
		compressor, err = gzip.NewWriterLevel(out, gzip.DefaultCompression)
	case artifact.FormatTarZstd:
		compressor, err = zstd.NewWriter(out, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedDefault))
	default:
		err = fmt.Errorf("unsupported layer format %q", w.plan.format)
	}
	if err != nil {
		return err
	}
	diff := digest.Canonical.Digester()
	sink := io.MultiWriter(out, diff.Hash())
	if compressor != nil {
		sink = io.MultiWriter(compressor, diff.Hash())
	}
	tw := tar.NewWriter(sink)
	for _, n := range w.plan.nodes {
		if err := w.writeEntry(tw, n); err != nil {
			if compressor != nil {
				compressor.Close()
			}
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if compressor != nil {
		if err := compressor.Close(); err != nil {
			return err
		}
	}
	w.mu.Lock()
	w.diff = diff.Digest()
	w.mu.Unlock()
	return nil
}

func (w *layerWriter) writeEntry(tw *tar.Writer, n node) error {
	hdr := &tar.Header{
		Name:    tarName(n),
		Mode:    int64(n.mode),
		ModTime: w.mtime,
		Format:  tar.FormatPAX,
	}
	if n.dir {
		hdr.Typeflag = tar.TypeDir
		return tw.WriteHeader(hdr)
	}
	hdr.Typeflag = tar.TypeReg
	hdr.Size = n.size
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	c, err := n.open(w.ctx, w.progress)
	if err != nil {
		return err
	}
	defer c.Close()
	// Copy exactly the size announced in the header; the reader reports a file that shrank or grew.
	if _, err := io.Copy(tw, c); err != nil {
		return fmt.Errorf("%s: %w", n.rel, err)
	}
	return nil
}
