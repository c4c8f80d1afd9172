// Package hf reads models from the Hugging Face Hub over its HTTP API (the one huggingface_hub and
// @huggingface/hub use): hf:// references, the token, the revision's commit, its file tree, and the files, checked
// against the digests the Hub states. It hands pack what it needs to pack a revision: the small files in a
// staging directory and the LFS files as pack.RemoteFile, read from the Hub only when their layers are written.
package hf

import (
	"fmt"
	"regexp"
	"strings"
)

// Scheme prefixes a Hub model reference.
const Scheme = "hf://"

// Ref names a model or dataset repository on the Hub and a revision (a branch, tag or commit; "main" if none is
// given).
type Ref struct {
	Repo     string // ORG/NAME, or datasets/ORG/NAME: the repository's path on the Hub's site
	Revision string
}

// datasetPrefix starts the Repo of a dataset: the Hub's pages and files of datasets live under /datasets/, and
// their API under /api/datasets/.
const datasetPrefix = "datasets/"

// IsDataset reports whether r names a dataset repository (hf://datasets/ORG/NAME).
func (r Ref) IsDataset() bool { return strings.HasPrefix(r.Repo, datasetPrefix) }

// ID is the repository id as huggingface_hub names it (ORG/NAME, for a dataset too).
func (r Ref) ID() string { return strings.TrimPrefix(r.Repo, datasetPrefix) }

func (r Ref) String() string { return Scheme + r.Repo + "@" + r.Revision }

// A repository name part, as huggingface_hub validates them: letters, digits, "-", "_", "."; no "--" or "..", not
// starting or ending with "-" or ".", at most 96 characters for the whole id.
var repoPart = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)

// IsReference reports whether s is meant as a Hub reference.
func IsReference(s string) bool { return strings.HasPrefix(s, Scheme) }

// ParseReference parses hf://ORG/NAME[@REVISION].
func ParseReference(s string) (Ref, error) {
	const form = "want hf://ORG/NAME, hf://datasets/ORG/NAME, either with @REVISION (a branch, tag or commit)"
	rest, ok := strings.CutPrefix(s, Scheme)
	if !ok {
		return Ref{}, fmt.Errorf("%q: not a Hugging Face reference: %s", s, form)
	}
	repo, rev, hasRev := strings.Cut(rest, "@")
	prefix := ""
	if r, ok := strings.CutPrefix(repo, datasetPrefix); ok {
		prefix, repo = datasetPrefix, r
	}
	if hasRev && (rev == "" || strings.ContainsAny(rev, "@?#\\ \t\n") || strings.Contains(rev, "..") ||
		strings.HasPrefix(rev, "/") || strings.HasSuffix(rev, "/") || strings.Contains(rev, "//") || len(rev) > 255) {
		return Ref{}, fmt.Errorf("%q: invalid revision %q: %s", s, rev, form)
	}
	if !hasRev {
		rev = "main"
	}
	parts := strings.Split(repo, "/")
	// hf://Qwen names an organisation, not a model; it is refused here, before any request. The Hub's few
	// un-namespaced models (gpt2, bert-base-uncased) moved under organisations in 2024 and their old names only
	// redirect, so ORG/NAME loses none of them.
	if len(parts) == 1 && repo != "" {
		return Ref{}, fmt.Errorf("%q: no repository, only %q (an organisation or user): %s; the Hub's un-namespaced models live under one now (hf://openai-community/gpt2)", s, repo, form)
	}
	if len(parts) > 2 || len(repo) > 96 {
		return Ref{}, fmt.Errorf("%q: invalid repository %q: %s", s, repo, form)
	}
	if prefix == "" && (parts[0] == "datasets" || parts[0] == "spaces") {
		return Ref{}, fmt.Errorf("%q: only model and dataset repositories can be packed (hf://datasets/ORG/NAME): %s", s, form)
	}
	for _, p := range parts {
		if !repoPart.MatchString(p) || strings.Contains(p, "--") || strings.Contains(p, "..") ||
			strings.HasSuffix(p, "-") || strings.HasSuffix(p, ".") {
			return Ref{}, fmt.Errorf("%q: invalid repository %q: %s", s, repo, form)
		}
	}
	return Ref{Repo: prefix + repo, Revision: rev}, nil
}
