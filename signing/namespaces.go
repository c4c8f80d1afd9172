package signing

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/modelpack/modelpack/scan"
)

// Rules scoped to namespaces: a rule with Namespaces governs a reference only for volumes of pods in one of those
// namespaces (the CSI publish context's csi.storage.k8s.io/pod.namespace). The rule for a reference is chosen in
// two passes over the rules in file order: first the namespace-scoped rules whose namespaces include the pod's,
// then the unscoped ones; the first whose match patterns match the repository applies, and Default when none
// does. So a scoped rule wins over an unscoped one for its namespaces whatever their order, and a caller with no
// namespace (a prepull, `modelpack verify`) is governed by the unscoped rules alone.

// compileNamespaces turns a rule's namespaces into anchored regexps: each is a namespace name (a DNS-1123 label,
// as Kubernetes names namespaces) or a glob over one with * and ?, which stay within the name ("team-*").
func compileNamespaces(ns []string, path string) ([]*regexp.Regexp, error) {
	var out []*regexp.Regexp
	for i, n := range ns {
		if !namespaceGlob.MatchString(n) || len(n) > 63 {
			return nil, fmt.Errorf("%s.namespaces[%d]: %q is not a namespace name or glob (lowercase letters, digits and '-', at most 63, starting and ending with a letter, a digit or a wildcard; * and ? match within the name)", path, i, n)
		}
		re, err := globRegexp(n, false)
		if err != nil {
			return nil, fmt.Errorf("%s.namespaces[%d]: %v", path, i, err)
		}
		out = append(out, re)
	}
	return out, nil
}

var namespaceGlob = regexp.MustCompile(`^[a-z0-9*?]([-a-z0-9*?]*[a-z0-9*?])?$`)

// inNamespace reports whether the rule is scoped to namespace (false for an unscoped rule).
func (r *rule) inNamespace(namespace string) bool {
	for _, re := range r.namespaces {
		if re.MatchString(namespace) {
			return true
		}
	}
	return false
}

// matches reports whether one of the rule's patterns matches the repository.
func (r *rule) matches(repo string) bool {
	for _, m := range r.match {
		if m.MatchString(repo) {
			return true
		}
	}
	return false
}

// ruleIn returns the rule governing a repository ("registry/path") for a volume of a pod in namespace ("" for
// none): scoped rules of that namespace first, then unscoped ones, each pass in file order, then the default.
func (p *Policy) ruleIn(namespace, repo string) *rule {
	if namespace != "" {
		for _, r := range p.rules {
			if r.inNamespace(namespace) && r.matches(repo) {
				return r
			}
		}
	}
	for _, r := range p.rules {
		if len(r.namespaces) == 0 && r.matches(repo) {
			return r
		}
	}
	return p.def
}

// VerifyIn is Verify for a volume of a pod in namespace: rules scoped to it come first ("" is Verify).
func (v *Verifier) VerifyIn(ctx context.Context, namespace, ref string) (Decision, error) {
	return v.verify(ctx, strings.TrimSpace(namespace), ref)
}

// AllowsScanIn is AllowsScan for a volume of a pod in namespace ("" is AllowsScan).
func (p *Policy) AllowsScanIn(namespace, ref, file string, r scan.Report) error {
	repo, digest, err := splitRef(ref)
	if err != nil {
		return err
	}
	return p.ruleIn(namespace, repo).allowsScan(ref, repo, digest, file, r)
}

// ScanNeededIn is ScanNeeded for a volume of a pod in namespace ("" is ScanNeeded).
func (p *Policy) ScanNeededIn(namespace, ref string) bool {
	repo, _, err := splitRef(ref)
	return err != nil || !p.ruleIn(namespace, repo).allowCode
}
