package pack

import (
	"bufio"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"

	"github.com/modelpack/modelpack/artifact"
)

// Rule assigns files or directories whose model-relative path matches Pattern to a layer kind. A rule that matches a directory packs the whole
// directory as one tar layer.
type Rule struct {
	Kind    artifact.Kind
	Pattern string
	// Source says where the rule came from, for error messages ("--dataset", "Modelfile:12").
	Source string
	// Glob says Pattern is in --include's syntax (artifact.MatchGlob: "**", a name without "/" at any depth), as
	// the rules of flags are; a Modelfile's keep modctl's path.Match of the whole path.
	Glob bool
}

// Matches reports whether the rule names the model-relative path rel itself, in the rule's own syntax.
func (r *Rule) Matches(rel string) bool {
	if r.Glob {
		return artifact.MatchGlob(r.Pattern, rel)
	}
	ok, _ := path.Match(r.Pattern, rel)
	return ok
}

// Modelfile is a parsed modctl-style Modelfile: metadata directives and file rules.
//
//	NAME llama3-8b          ARCH transformer       FAMILY llama3         FORMAT safetensors
//	PARAMSIZE 8B            PRECISION bf16         QUANTIZATION awq
//	MODEL *.safetensors     CONFIG config.json     DOC *.md              CODE *.py      DATASET data
//
// Keywords are case-insensitive; '#' starts a comment line.
type Modelfile struct {
	Name, Arch, Family, Format, ParamSize, Precision, Quantization string
	Rules                                                          []Rule
}

var modelfileKinds = map[string]artifact.Kind{
	"MODEL": artifact.KindWeight, "CONFIG": artifact.KindWeightConfig, "DOC": artifact.KindDoc,
	"CODE": artifact.KindCode, "DATASET": artifact.KindDataset,
}

// ParseModelfile reads a Modelfile. name is used in error messages.
func ParseModelfile(r io.Reader, name string) (*Modelfile, error) {
	mf := &Modelfile{}
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		keyword, arg, _ := strings.Cut(text, " ")
		keyword = strings.ToUpper(keyword)
		arg = unquote(strings.TrimSpace(arg))
		where := fmt.Sprintf("%s:%d", name, line)
		if arg == "" {
			return nil, fmt.Errorf("%s: %s needs an argument", where, keyword)
		}
		if k, ok := modelfileKinds[keyword]; ok {
			arg = strings.TrimSuffix(arg, "/")
			if err := checkPattern(arg); err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			mf.Rules = append(mf.Rules, Rule{Kind: k, Pattern: arg, Source: where})
			continue
		}
		var dst *string
		switch keyword {
		case "NAME":
			dst = &mf.Name
		case "ARCH":
			dst = &mf.Arch
		case "FAMILY":
			dst = &mf.Family
		case "FORMAT":
			dst = &mf.Format
		case "PARAMSIZE":
			ps, err := ParseParamSize(arg)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			arg, dst = ps, &mf.ParamSize
		case "PRECISION":
			dst = &mf.Precision
		case "QUANTIZATION":
			dst = &mf.Quantization
		default:
			return nil, fmt.Errorf("%s: unknown directive %q (valid: NAME, ARCH, FAMILY, FORMAT, PARAMSIZE, PRECISION, QUANTIZATION, MODEL, CONFIG, DOC, CODE, DATASET)", where, keyword)
		}
		*dst = arg
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return mf, nil
}

// unquote strips one pair of surrounding quotes, as modctl's Modelfile parser does: NAME "llama 3" is llama 3.
func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '"' || s[0] == '\'') && s[len(s)-1] == s[0] {
		if s[0] == '"' {
			if u, err := strconv.Unquote(s); err == nil {
				return u
			}
		}
		return s[1 : len(s)-1]
	}
	return s
}

// checkPattern refuses patterns that could never match a model-relative path.
func checkPattern(p string) error {
	if p == "" {
		return fmt.Errorf("empty pattern: name a file, a directory or a glob inside the model")
	}
	if _, err := path.Match(p, ""); err != nil {
		return fmt.Errorf("invalid pattern %q: %w", p, err)
	}
	if strings.HasPrefix(p, "/") || p == ".." || strings.HasPrefix(p, "../") {
		return fmt.Errorf("pattern %q must be relative to the model directory", p)
	}
	return nil
}

// ParseRule parses a --kind value, PATTERN=KIND; KIND=PATTERN, the spelling of earlier releases, is read too
// when only its left side is a kind. A value both of whose sides are kinds is PATTERN=KIND. PATTERN is in
// --include's syntax (artifact.MatchGlob).
func ParseRule(s, source string) (Rule, error) {
	i := strings.LastIndex(s, "=")
	if i < 0 {
		return Rule{}, fmt.Errorf("%s %q: want PATTERN=KIND (valid kinds: %s)", source, s, artifact.KindNames())
	}
	p, k := s[:i], s[i+1:]
	kind, err := artifact.ParseKind(k)
	if err != nil {
		left, right, _ := strings.Cut(s, "=")
		old, oldErr := artifact.ParseKind(left)
		if oldErr != nil {
			return Rule{}, fmt.Errorf("%s %q: want PATTERN=KIND, and neither %q nor %q is a kind (%s)", source, s, k, left, artifact.ValidKinds())
		}
		kind, p = old, right
	}
	return NewRule(kind, p, source)
}

// NewRule is a flag's rule: pattern, in --include's syntax, packed as kind.
func NewRule(kind artifact.Kind, pattern, source string) (Rule, error) {
	pattern = strings.TrimSuffix(pattern, "/")
	if err := checkPattern(pattern); err != nil {
		return Rule{}, fmt.Errorf("%s: %w", source, err)
	}
	if err := artifact.ValidateGlob(pattern); err != nil {
		return Rule{}, fmt.Errorf("%s: %w", source, err)
	}
	return Rule{Kind: kind, Pattern: pattern, Source: source, Glob: true}, nil
}
