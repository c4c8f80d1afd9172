package layout

import (
	"fmt"
	"strings"

	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry"
)

// ParseReference checks a store reference and returns its canonical form. A reference is a registry reference
// whose registry host may be left out: "llama3", "llama3:8b", "org/model@sha256:…", "registry.local:5000/org/m:v1".
// A reference with neither tag nor digest gets the tag "latest". Names follow the distribution grammar, so any
// stored reference can be pushed to a registry as it is.
func ParseReference(s string) (string, error) {
	if strings.HasSuffix(s, ":") || strings.HasSuffix(s, "@") {
		return "", fmt.Errorf("%w %q: empty tag or digest", errdef.ErrInvalidReference, s)
	}
	host, _, hasSlash := strings.Cut(s, "/")
	// As in Docker, a first component is a registry host only if it looks like one and something follows it.
	withHost := hasSlash && (strings.ContainsAny(host, ".:") || host == "localhost")
	full := s
	if !withHost {
		full = "localhost/" + s
	}
	ref, err := registry.ParseReference(full)
	if err != nil {
		// oras says "invalid reference: <why>"; say which reference, keeping errors.Is(err, errdef.ErrInvalidReference).
		why := strings.TrimPrefix(err.Error(), errdef.ErrInvalidReference.Error()+": ")
		return "", fmt.Errorf("%w %q: %s", errdef.ErrInvalidReference, s, why)
	}
	if ref.Reference == "" {
		ref.Reference = "latest"
	}
	out := ref.String()
	if !withHost {
		out = strings.TrimPrefix(out, "localhost/")
	}
	return out, nil
}
