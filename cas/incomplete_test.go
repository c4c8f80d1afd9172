package cas

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	digest "github.com/opencontainers/go-digest"
)

// A source that breaks part way (a dropped connection: an error, not a clean end) is ErrIncomplete, typed, with
// the partial kept for the next Ingest; it is not a size mismatch.
func TestBrokenSourceIsIncompleteAndResumes(t *testing.T) {
	s := open(t)
	b := blob(3 << 20)
	d := digest.FromBytes(b)
	broken := func(_ context.Context, offset int64) (io.ReadCloser, int64, error) {
		return io.NopCloser(io.MultiReader(bytes.NewReader(b[offset:1<<20]), errReader{io.ErrUnexpectedEOF})), offset, nil
	}
	err := s.Ingest(context.Background(), d, int64(len(b)), broken)
	if !errors.Is(err, ErrIncomplete) || errors.Is(err, ErrSizeMismatch) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %v, want ErrIncomplete wrapping the cause", err)
	}
	if got := partials(t, s)[d]; got != 1<<20 {
		t.Fatalf("partial holds %d bytes, want %d", got, 1<<20)
	}
	if err := s.Ingest(context.Background(), d, int64(len(b)), (&source{blob: b, seekable: true}).open); err != nil {
		t.Fatal(err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
