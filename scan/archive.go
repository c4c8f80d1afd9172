package scan

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/klauspost/compress/zstd"
)

// tar walks the members in place: a member's bytes are a section of the file, scanned by content like any file.
// Layers of OCI artifacts are tars; a PyTorch archive inside one is found like one on disk.
func (s *scanner) tar(r io.ReaderAt, size int64, depth int) Report {
	res := newResult("tar", s.lim.MaxFindings)
	sr := io.NewSectionReader(r, 0, size)
	tr := tar.NewReader(sr)
	for n := 0; ; n++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			res.malformed("tar: %v", err)
			break
		}
		if n >= s.lim.MaxEntries {
			res.malformed("tar: over %d members", s.lim.MaxEntries)
			break
		}
		switch h.Typeflag {
		case tar.TypeReg, '\x00': // regular files (and the old TypeRegA)
		case tar.TypeGNUSparse:
			res.add(Finding{File: h.Name, Verdict: Malformed, Detail: "sparse tar member"})
			continue
		default:
			continue
		}
		// archive/tar reads headers without buffering ahead: the data starts at the section's position.
		off, _ := sr.Seek(0, io.SeekCurrent)
		if h.Size < 0 || off+h.Size > size {
			res.add(Finding{File: h.Name, Verdict: Malformed, Detail: "member runs past the end of the archive"})
			break
		}
		res.mergeFile(h.Name, s.file(io.NewSectionReader(r, off, h.Size), h.Size, depth+1))
	}
	return res.report()
}

// compressed decompresses a gzip or zstd stream into a spool file (bounded by MaxSpool) and scans what it holds.
func (s *scanner) compressed(format string, r io.ReaderAt, size int64, depth int) Report {
	src := io.NewSectionReader(r, 0, size)
	var rd io.Reader
	switch format {
	case "gzip":
		g, err := gzip.NewReader(src)
		if err != nil {
			return malformedReport(format, "gzip: "+err.Error())
		}
		defer g.Close()
		rd = g
	default:
		z, err := zstd.NewReader(src, zstd.WithDecoderMaxMemory(64<<20), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return malformedReport(format, "zstd: "+err.Error())
		}
		defer z.Close()
		rd = z
	}
	ra, done, err := s.spool(rd, -1)
	if err != nil {
		return malformedReport(format, format+": "+err.Error())
	}
	defer done()
	sf := ra.(*sizedFile)
	inner := s.file(sf, sf.n, depth+1)
	res := newResult(format+"+"+inner.Format, s.lim.MaxFindings)
	res.merge("", inner)
	return res.report()
}

// spoolFile copies rd into a temporary file in SpoolDir, removed by done, within MaxSpool. n is the declared
// size, or -1.
func (s *scanner) spoolFile(rd io.Reader, n int64) (io.ReaderAt, func(), error) {
	max := s.lim.MaxSpool
	f, err := os.CreateTemp(s.lim.SpoolDir, "modelpack-scan-*")
	if err != nil {
		return nil, nil, err
	}
	done := func() { f.Close(); os.Remove(f.Name()) }
	got, err := io.Copy(f, io.LimitReader(rd, max+1))
	switch {
	case err != nil:
		done()
		return nil, nil, err
	case got > max:
		done()
		return nil, nil, fmt.Errorf("over %d decompressed bytes (limit)", max)
	case n >= 0 && got != n:
		done()
		return nil, nil, fmt.Errorf("%d bytes where %d were declared", got, n)
	}
	return &sizedFile{f, got}, done, nil
}

type sizedFile struct {
	*os.File
	n int64
}
