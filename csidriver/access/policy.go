package access

import (
	"fmt"
	"strings"
)

// Mode is kubelet's imagePullCredentialsVerificationPolicy, with its names and meanings, for models.
type Mode string

const (
	// NeverVerify shares content a registry served under a name with every caller naming it: the behaviour of
	// kubelet before KEP-2535. A name that never served the digest is still checked with its registry.
	NeverVerify Mode = "NeverVerify"
	// NeverVerifyPreloadedImages checks every caller against the records, except for prepulled content
	// (kubelet's preloaded images), which any caller naming it may mount. kubelet 1.36's default.
	NeverVerifyPreloadedImages Mode = "NeverVerifyPreloadedImages"
	// NeverVerifyAllowlistedImages is NeverVerifyPreloadedImages for prepulled content whose name the allowlist
	// matches only.
	NeverVerifyAllowlistedImages Mode = "NeverVerifyAllowlistedImages"
	// AlwaysVerify checks every caller, prepulled content included.
	AlwaysVerify Mode = "AlwaysVerify"
)

// DefaultMode is kubelet 1.36's default.
const DefaultMode = NeverVerifyPreloadedImages

// Modes lists the valid modes, for flags and messages.
var Modes = []Mode{NeverVerify, NeverVerifyPreloadedImages, NeverVerifyAllowlistedImages, AlwaysVerify}

// Policy decides, from a key's records, whether a caller may read content the node holds without asking the
// registry.
type Policy struct {
	Mode Mode
	// Allowlist are kubelet's preloadedImagesVerificationAllowlist patterns: host/repository, or a prefix
	// ending in /* (registry.example.com/models/*), matched at path-component boundaries.
	Allowlist []string
}

// NewPolicy validates a mode ("" is DefaultMode) and an allowlist, which only NeverVerifyAllowlistedImages
// reads (kubelet refuses one with any other mode, and so does this).
func NewPolicy(mode string, allowlist []string) (Policy, error) {
	p := Policy{Mode: Mode(mode)}
	if mode == "" {
		p.Mode = DefaultMode
	}
	valid := false
	for _, m := range Modes {
		valid = valid || p.Mode == m
	}
	if !valid {
		return Policy{}, fmt.Errorf("image pull credentials verification policy %q: valid values are %s", mode, joinModes())
	}
	if len(allowlist) > 0 && p.Mode != NeverVerifyAllowlistedImages {
		return Policy{}, fmt.Errorf("a preloaded images verification allowlist is only read with %s (the policy is %s)", NeverVerifyAllowlistedImages, p.Mode)
	}
	for _, pat := range allowlist {
		if err := checkPattern(pat); err != nil {
			return Policy{}, fmt.Errorf("preloaded images verification allowlist entry %q: %v", pat, err)
		}
	}
	p.Allowlist = allowlist
	return p, nil
}

func joinModes() string {
	s := make([]string, len(Modes))
	for i, m := range Modes {
		s[i] = string(m)
	}
	return strings.Join(s, ", ")
}

// checkPattern accepts what kubelet does: a registry host (with a dot, a port or localhost) followed by one or
// more repository path components, the last of which may be "*"; no tag, no digest, no other wildcard.
func checkPattern(p string) error {
	name, wild := strings.CutSuffix(p, "/*")
	if strings.ContainsAny(name, "*@") {
		return fmt.Errorf("want registry/repository or registry/prefix/*: no tag, digest or inner wildcard")
	}
	host, path, ok := strings.Cut(name, "/")
	if !ok && !wild {
		return fmt.Errorf("want registry/repository or registry/prefix/*: a repository path is missing")
	}
	if host == "" || !(strings.ContainsAny(host, ".:") || host == "localhost") {
		return fmt.Errorf("%q is not a registry host (a name with a dot or a port, or localhost)", host)
	}
	if ok {
		for _, c := range strings.Split(path, "/") {
			if c == "" {
				return fmt.Errorf("empty path component")
			}
			for _, r := range c {
				if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
					return fmt.Errorf("repository component %q: lower-case letters, digits and . _ - only", c)
				}
			}
		}
	}
	return nil
}

// allowlisted reports whether a pattern of the allowlist matches name (host/repository).
func (p Policy) allowlisted(name string) bool {
	for _, pat := range p.Allowlist {
		if prefix, ok := strings.CutSuffix(pat, "/*"); ok {
			if strings.HasPrefix(name, prefix+"/") {
				return true
			}
		} else if name == pat {
			return true
		}
	}
	return false
}

// Allows reports whether who may read k's content, which the node holds, from the records alone: a record of
// its own credential, content that is public, or content the node read with its own credentials (a prepull, or a
// pod's publish under NeverVerify) that the mode exempts. False means: ask the registry, with who's credential,
// first.
func (p Policy) Allows(k Key, recs []Record, who Identity) bool {
	if len(recs) == 0 {
		return false
	}
	if p.Mode == NeverVerify {
		return true
	}
	for _, r := range recs {
		switch r.Kind {
		case Anonymous:
			return true
		case Secret:
			if who.Kind == Secret && r.Hash == who.Hash {
				return true
			}
		case Prepull, Node:
			if p.Mode == NeverVerifyPreloadedImages || (p.Mode == NeverVerifyAllowlistedImages && p.allowlisted(k.Name())) {
				return true
			}
		}
	}
	return false
}
