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

// checkSyntax says what to write instead of a reference the distribution grammar refuses in ways users make: a URL
// scheme, upper case in the repository.
func checkSyntax(s string) error {
	for _, scheme := range []string{"http://", "https://", "oci://"} {
		if rest, ok := strings.CutPrefix(strings.ToLower(s), scheme); ok {
			hint := ""
			if scheme == "http://" {
				hint = " and add --plain-http for a plain-HTTP registry"
			}
			return fmt.Errorf("%q: a reference has no scheme: write %s%s", s, s[len(scheme):len(scheme)+len(rest)], hint)
		}
	}
	if host, rest, ok := strings.Cut(s, "/"); ok {
		repo := rest
		if i := strings.IndexAny(rest, ":@"); i >= 0 {
			repo = rest[:i]
		}
		if repo != strings.ToLower(repo) {
			return fmt.Errorf("%q: repository names are lowercase: write %s/%s%s", s, host, strings.ToLower(repo), rest[len(repo):])
		}
	}
	return nil
}

// registryRef checks a reference a command reads from a registry: it must name the registry and a tag or digest.
// No tag is not quietly "latest": an artifact repository seldom has one, and the failure would name neither.
func registryRef(s string) (registry.Reference, error) {
	if err := checkSyntax(s); err != nil {
		return registry.Reference{}, err
	}
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
	if err := checkSyntax(s); err != nil {
		return registry.Reference{}, err
	}
	if !namesRegistry(s) {
		return registry.Reference{}, fmt.Errorf("%q names no registry: a bare name is a local-store name; write REGISTRY/REPOSITORY", s)
	}
	return registry.ParseReference(s)
}
