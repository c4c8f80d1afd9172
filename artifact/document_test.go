package artifact

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// One answer to "is this an index / a manifest" and "is this document too large to read", for OCI and Docker names.
func TestDocumentKinds(t *testing.T) {
	for mt, want := range map[string][2]bool{
		ocispec.MediaTypeImageIndex:    {true, false},
		MediaTypeDockerManifestList:    {true, false},
		ocispec.MediaTypeImageManifest: {false, true},
		MediaTypeDockerManifest:        {false, true},
		MediaTypeModelConfig:           {false, false},
		"":                             {false, false},
	} {
		if got := [2]bool{IsIndex(mt), IsManifest(mt)}; got != want {
			t.Errorf("%q: IsIndex, IsManifest = %v, want %v", mt, got, want)
		}
	}
	if err := CheckSize("manifest", ocispec.Descriptor{Size: MaxManifestBytes}); err != nil {
		t.Errorf("at the limit: %v", err)
	}
	err := CheckSize("config", ocispec.Descriptor{Digest: "sha256:x", Size: MaxManifestBytes + 1})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "config sha256:x") || !strings.Contains(err.Error(), "limit") {
		t.Errorf("over the limit: %v", err)
	}
}

func TestCheckDocumentLimits(t *testing.T) {
	layers := func(n int, entry string) string {
		return `{"schemaVersion":2,"layers":[` + strings.TrimSuffix(strings.Repeat(entry+",", n), ",") + `]}`
	}
	annotations := func(n int) string {
		var b strings.Builder
		b.WriteString(`{"annotations":{`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"k` + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + `":""`)
		}
		b.WriteString("}}")
		return b.String()
	}
	for _, c := range []struct {
		name, doc string
		want      error
	}{
		{"an OCI manifest", `{"schemaVersion":2,"config":{"mediaType":"a","digest":"sha256:00","size":2},"layers":[{"mediaType":"b","annotations":{"k":"v"}}]}`, nil},
		{"as many layers as allowed", layers(MaxEntries, "{}"), nil},
		{"one layer too many", layers(MaxEntries+1, "{}"), ErrTooLarge},
		{"an annotation map too many keys", annotations(MaxEntries + 1), ErrTooLarge},
		{"nested as deep as allowed", strings.Repeat("[", MaxNesting) + strings.Repeat("]", MaxNesting), nil},
		{"nested one level too deep", strings.Repeat("[", MaxNesting+1) + strings.Repeat("]", MaxNesting+1), ErrTooLarge},
		{"nested 100k deep", strings.Repeat(`{"a":`, 100_000) + strings.Repeat("}", 100_000), ErrTooLarge},
		{"over the byte limit", `"` + strings.Repeat("x", MaxManifestBytes) + `"`, ErrTooLarge},
		{"too many values in all", `[` + strings.Repeat(`[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],`, MaxValues/16) + `0]`, ErrTooLarge},
		{"cut short", `{"layers":[{}`, ErrMalformed},
		{"not JSON", `{"layers":]`, ErrMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := CheckDocument([]byte(c.doc))
			if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if c.want != nil && errors.Is(c.want, ErrTooLarge) && !strings.Contains(err.Error(), "limit") {
				t.Fatalf("%v does not name the limit", err)
			}
		})
	}
}

func TestReadDocumentRefusesBeforeReading(t *testing.T) {
	r := &countingReader{r: strings.NewReader("{}")}
	if _, err := ReadDocument(r, MaxManifestBytes+1, "manifest x"); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "manifest x") {
		t.Fatalf("got %v", err)
	}
	if r.n != 0 {
		t.Fatalf("read %d bytes of a document declared too large", r.n)
	}
	// Undeclared (chunked): read up to the limit and no further.
	big := &countingReader{r: bytes.NewReader(make([]byte, 3*MaxManifestBytes))}
	if _, err := ReadDocument(big, -1, "manifest y"); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v", err)
	}
	if big.n > MaxManifestBytes+1 {
		t.Fatalf("read %d bytes, the limit is %d", big.n, MaxManifestBytes)
	}
}

type countingReader struct {
	r interface{ Read([]byte) (int, error) }
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// FuzzCheckDocument: whatever the bytes, CheckDocument never panics, and what it accepts is within the limits and
// decodes (when it is JSON at all) without hitting encoding/json's own depth limit.
func FuzzCheckDocument(f *testing.F) {
	for _, s := range []string{`{}`, `[]`, `{"layers":[{},{}]}`, `[[[[]]]]`, `{"a":{"b":[1,"x",null,true]}}`, `{"a"`, `]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if CheckDocument(b) != nil {
			return
		}
		var v any
		if err := json.Unmarshal(b, &v); err != nil && strings.Contains(err.Error(), "depth") {
			t.Fatalf("accepted a document too deep for encoding/json: %v", err)
		}
	})
}
