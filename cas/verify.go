package cas

import (
	"fmt"
	"hash"
	"io"
	"os"

	digest "github.com/opencontainers/go-digest"
)

// Verifier is the one check of bytes against the digest and size their descriptor declares. Every path that reads
// a blob from a source goes through it (an ingest, a fetch into a directory, an unpack, a pack from the Hugging
// Face Hub, a manifest read into memory), so a wrong size is always ErrSizeMismatch and wrong bytes always
// ErrDigestMismatch, whichever path met them.
type Verifier struct {
	d       digest.Digest
	size    int64
	h       hash.Hash
	n       int64
	invalid error // d cannot be checked against (a malformed digest, an unknown algorithm): nothing matches it
}

// NewVerifier starts the check of blob d of size bytes.
func NewVerifier(d digest.Digest, size int64) *Verifier {
	if err := d.Validate(); err != nil {
		return &Verifier{d: d, size: size, invalid: err}
	}
	return &Verifier{d: d, size: size, h: d.Algorithm().Hash()}
}

// Write hashes and counts p.
func (v *Verifier) Write(p []byte) (int, error) {
	if v.h != nil {
		v.h.Write(p)
	}
	v.n += int64(len(p))
	if hashedHook != nil {
		hashedHook(v.d, len(p))
	}
	return len(p), nil
}

// Written is how many bytes were written.
func (v *Verifier) Written() int64 { return v.n }

// Reset forgets what was written (a source that starts over from its first byte).
func (v *Verifier) Reset() {
	if v.h != nil {
		v.h.Reset()
	}
	v.n = 0
}

// Check reports ErrSizeMismatch if the bytes written are not the declared size, else ErrDigestMismatch if they do
// not hash to the declared digest. The caller names the blob.
func (v *Verifier) Check() error {
	if v.n != v.size {
		return fmt.Errorf("%w: got %d bytes, want %d", ErrSizeMismatch, v.n, v.size)
	}
	if v.invalid != nil {
		return fmt.Errorf("%w: %q cannot be checked: %v", ErrDigestMismatch, v.d, v.invalid)
	}
	if got := digest.NewDigest(v.d.Algorithm(), v.h); got != v.d {
		return fmt.Errorf("%w: the bytes hash to %s, want %s", ErrDigestMismatch, got, v.d)
	}
	return nil
}

// Resume feeds v the bytes a partial file (f, open at its start) already holds of the blob and leaves f positioned
// after them, so a transfer can go on from there. A file longer than the blob is emptied.
func (v *Verifier) Resume(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() > v.size {
		return f.Truncate(0)
	}
	_, err = io.CopyN(v, f, fi.Size())
	return err
}

// Reader reads r through v. It never asks r for more than one byte past the declared size, fails with
// ErrSizeMismatch as soon as that byte arrives, and ends with Check's error in place of io.EOF unless the bytes
// match, so a consumer that reads to the end never takes wrong bytes for a blob.
func (v *Verifier) Reader(r io.Reader) io.Reader { return &verifyingReader{r: r, v: v} }

type verifyingReader struct {
	r io.Reader
	v *Verifier
}

func (vr *verifyingReader) Read(p []byte) (int, error) {
	left := vr.v.size - vr.v.n + 1
	if left <= 0 {
		return 0, vr.v.Check()
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := vr.r.Read(p)
	vr.v.Write(p[:n])
	if vr.v.n > vr.v.size || err == io.EOF {
		if cerr := vr.v.Check(); cerr != nil {
			return n, cerr
		}
	}
	return n, err
}

// ReadAll reads the whole blob d of size bytes from r into memory, checked. Callers bound size first (a manifest, a
// config: artifact.CheckSize).
func ReadAll(r io.Reader, d digest.Digest, size int64) ([]byte, error) {
	return io.ReadAll(NewVerifier(d, size).Reader(r))
}

// hashedHook, if set (CountHashedForTesting), is told of every byte a Verifier hashes.
var hashedHook func(d digest.Digest, n int)
