package artifact

import (
	"errors"
	"strings"

	digest "github.com/opencontainers/go-digest"
)

// ErrCredentialsInReference is a reference that carries credentials (user:password@host/…). It is refused without
// being repeated, so the password reaches no error message and no log.
var ErrCredentialsInReference = errors.New("a reference may not carry credentials (user:password@ before the " +
	"registry host): give them as a pull secret or with login, and change that password, which may already be in " +
	"a shell history or a manifest")

// RefuseCredentials returns ErrCredentialsInReference when s has credentials before its registry host, as a URL
// would ("user:pw@host/repo:tag", "https://user@host/repo"). A digest ("name@sha256:…", "host/repo@sha256:…")
// is not credentials.
func RefuseCredentials(s string) error {
	scheme, rest, ok := strings.Cut(s, "://")
	if ok {
		s = rest
	}
	first, _, hasSlash := strings.Cut(s, "/")
	at := strings.LastIndex(first, "@")
	if at < 0 {
		return nil
	}
	if !hasSlash && scheme == "hf" && !strings.Contains(first[:at], ":") {
		return nil // hf://ORG@REVISION: a revision (and a usage error of its own), no user:password
	}
	if !hasSlash {
		if _, err := digest.Parse(first[at+1:]); err == nil {
			return nil // a local name with a digest
		}
	}
	return ErrCredentialsInReference
}
