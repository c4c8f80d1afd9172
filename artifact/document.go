package artifact

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/internal/errdef"
)

// Limits of every manifest-like document read (manifests, indexes, referrers lists, cosign signature manifests,
// configs): they are read into memory and parsed, so a registry that serves a huge or pathological one must be
// refused before it costs the node memory. The byte limit is the distribution registry's own (it refuses to store
// a larger manifest); the others bound what the parse of a document under that limit allocates.
const (
	// MaxManifestBytes bounds one document.
	MaxManifestBytes = 4 << 20
	// MaxEntries bounds the members of one JSON array or object: the layers of a manifest, the manifests of an
	// index or referrers list, the keys of an annotation map.
	MaxEntries = 16384
	// MaxValues bounds the JSON values of one document (4 MiB of "{}," would otherwise decode to a million
	// descriptors).
	MaxValues = 1 << 18
	// MaxNesting bounds how deep a document nests; an OCI manifest nests five levels.
	MaxNesting = 32
)

// ErrTooLarge is a document over one of the limits above.
var ErrTooLarge = errdef.ErrTooLarge

// The Docker v2 names of a manifest and an index, read wherever OCI's are.
const (
	MediaTypeDockerManifest     = "application/vnd.docker.distribution.manifest.v2+json"
	MediaTypeDockerManifestList = "application/vnd.docker.distribution.manifest.list.v2+json"
)

// IsIndex reports whether mediaType names an index: OCI's, or Docker's manifest list.
func IsIndex(mediaType string) bool {
	return mediaType == ocispec.MediaTypeImageIndex || mediaType == MediaTypeDockerManifestList
}

// IsManifest reports whether mediaType names an image manifest: OCI's, or Docker's v2.
func IsManifest(mediaType string) bool {
	return mediaType == ocispec.MediaTypeImageManifest || mediaType == MediaTypeDockerManifest
}

// CheckSize refuses a document whose descriptor declares more than MaxManifestBytes, before anything fetches it.
// what names it in errors ("manifest", "config").
func CheckSize(what string, d ocispec.Descriptor) error {
	return checkDeclared(fmt.Sprintf("%s %s", what, d.Digest), d.Size)
}

func checkDeclared(what string, declared int64) error {
	if declared > MaxManifestBytes {
		return fmt.Errorf("%s is %d bytes: %w (limit %d)", what, declared, ErrTooLarge, MaxManifestBytes)
	}
	return nil
}

// ReadDocument reads a document of declared size (-1 when unknown) from r, refusing it before the read when the
// declared size is over MaxManifestBytes and during the read when more arrives, then checks its shape with
// CheckDocument. what names it in errors ("manifest sha256:…").
func ReadDocument(r io.Reader, declared int64, what string) ([]byte, error) {
	if err := checkDeclared(what, declared); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(r, MaxManifestBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxManifestBytes {
		return nil, fmt.Errorf("%s is over %d bytes: %w", what, MaxManifestBytes, ErrTooLarge)
	}
	if err := CheckDocument(b); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return b, nil
}

// ErrMalformed is a document that is not JSON, or whose descriptors are not well formed (a negative size, an
// invalid digest).
var ErrMalformed = errors.New("malformed document")

// CheckDocument streams over b, a JSON document, and refuses it when it is over MaxManifestBytes or nests, counts
// or lists more than the limits allow, before anything decodes it into structures. Only the shape is checked.
func CheckDocument(b []byte) error {
	if len(b) > MaxManifestBytes {
		return fmt.Errorf("%w: %d bytes (limit %d)", ErrTooLarge, len(b), MaxManifestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	type frame struct {
		object, key bool // an object, and its next token is a key
		n           int
	}
	var (
		open   []frame
		values int
	)
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			if len(open) > 0 {
				return fmt.Errorf("%w: unexpected end", ErrMalformed)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			open = open[:len(open)-1]
			if n := len(open); n > 0 && open[n-1].object {
				open[n-1].key = true
			}
			continue
		}
		top := len(open) - 1
		if top >= 0 && open[top].key {
			open[top].key = false // an object's key: its value is what counts
			continue
		}
		if values++; values > MaxValues {
			return fmt.Errorf("%w: more than %d values (limit)", ErrTooLarge, MaxValues)
		}
		if top >= 0 {
			if open[top].n++; open[top].n > MaxEntries {
				return fmt.Errorf("%w: a list or object of more than %d entries (limit)", ErrTooLarge, MaxEntries)
			}
		}
		if d, ok := tok.(json.Delim); ok {
			if len(open) >= MaxNesting {
				return fmt.Errorf("%w: nested more than %d levels deep (limit)", ErrTooLarge, MaxNesting)
			}
			open = append(open, frame{object: d == '{', key: d == '{'})
			continue
		}
		if top >= 0 && open[top].object {
			open[top].key = true
		}
	}
}
