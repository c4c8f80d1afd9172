package cli

import (
	"fmt"
	"strings"

	"oras.land/oras-go/v2/registry"
)

// One rule for names, in every command: a reference names a registry only when its first component looks like a
// host (has a "." or ":", or is "localhost") and something follows it, as in Docker. Anything else — "llama3:8b",
// "org/model" — is a name in the local store. Registry commands refuse local names instead of guessing docker.io.

// namesRegistry reports whether s names a registry by the rule above.
func namesRegistry(s string) bool {
	host, rest, ok := strings.Cut(s, "/")
	return ok && rest != "" && (strings.ContainsAny(host, ".:") || host == "localhost")
}

// registryRef checks a reference a command reads from a registry: it must name the registry and a tag or digest.
// No tag is not quietly "latest": an artifact repository seldom has one, and the failure would name neither.
func registryRef(s string) (registry.Reference, error) {
	if !namesRegistry(s) {
		return registry.Reference{}, fmt.Errorf("%q names no registry: a bare name is a local-store name; write REGISTRY/REPOSITORY:TAG (docker.io/library/… for Docker Hub)", s)
	}
	ref, err := registry.ParseReference(s)
	if err != nil {
		return registry.Reference{}, err
	}
	if ref.Reference == "" {
		return registry.Reference{}, fmt.Errorf("%q has no tag or digest: write %s:TAG or %s@sha256:… (modelpack tags %s lists the tags)", s, s, s, s)
	}
	return ref, nil
}

// registryRepo checks a repository reference for commands that take one without a tag (tags, push's target).
func registryRepo(s string) (registry.Reference, error) {
	if !namesRegistry(s) {
		return registry.Reference{}, fmt.Errorf("%q names no registry: a bare name is a local-store name; write REGISTRY/REPOSITORY", s)
	}
	return registry.ParseReference(s)
}
