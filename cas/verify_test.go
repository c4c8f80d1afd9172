package cas

import (
	"bytes"
	"errors"
	"io"
	"testing"

	digest "github.com/opencontainers/go-digest"
)

// The one check: a wrong size is ErrSizeMismatch (and never read past one byte over), wrong bytes of the right
// size ErrDigestMismatch, both from the reader and for bytes in memory.
func TestVerifier(t *testing.T) {
	b := bytes.Repeat([]byte("blob"), 1000)
	d := digest.FromBytes(b)
	flipped := bytes.Clone(b)
	flipped[7] ^= 1
	for _, c := range []struct {
		name string
		src  []byte
		size int64
		want error
	}{
		{"right", b, int64(len(b)), nil},
		{"short", b[:len(b)-1], int64(len(b)), ErrSizeMismatch},
		{"long", append(bytes.Clone(b), make([]byte, 1<<20)...), int64(len(b)), ErrSizeMismatch},
		{"flipped", flipped, int64(len(b)), ErrDigestMismatch},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := &countReader{r: bytes.NewReader(c.src)}
			got, err := io.ReadAll(NewVerifier(d, c.size).Reader(src))
			if !errors.Is(err, c.want) || (c.want == nil && !bytes.Equal(got, b)) {
				t.Fatalf("reader: %v, want %v", err, c.want)
			}
			if src.n > c.size+1 {
				t.Errorf("read %d bytes of a source declared %d", src.n, c.size)
			}
			if _, err := ReadAll(bytes.NewReader(c.src), d, c.size); !errors.Is(err, c.want) {
				t.Errorf("bytes: %v, want %v", err, c.want)
			}
		})
	}
	// A digest nothing can match (hostile input) is a mismatch, not a panic.
	for _, bad := range []digest.Digest{"sha999:00", "sha256:xyz", ""} {
		if _, err := ReadAll(bytes.NewReader(b), bad, int64(len(b))); !errors.Is(err, ErrDigestMismatch) {
			t.Errorf("%q: %v, want a digest mismatch", bad, err)
		}
	}
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
