package hf

import "strings"

// The Hub's --include/--exclude are huggingface_hub's allow_patterns/ignore_patterns, so a pattern copied from
// `hf download --include` or `snapshot_download(allow_patterns=…)` keeps the same files here. huggingface_hub
// (src/huggingface_hub/utils/_paths.py, filter_repo_objects) turns "\" into "/" in patterns and paths, appends "*"
// to a pattern ending in "/", and matches the whole path with Python's fnmatch.fnmatchcase: "*" matches any run
// of characters including "/", "?" one character, "[seq]"/"[!seq]" one character in or not in seq, an unclosed "["
// is a literal, and no pattern is invalid. Our own flags for local stores use artifact.MatchInclude instead.

// hubPattern is one pattern compiled for hubMatch.
type hubPattern []hubToken

type hubToken struct {
	kind   byte // '*', '?', '[' or 'c' (a literal)
	lit    rune
	negate bool
	ranges [][2]rune // the members of a class, a single character as lo == hi
}

func compileHub(pattern string) hubPattern {
	pattern = strings.ReplaceAll(pattern, `\`, "/")
	if strings.HasSuffix(pattern, "/") {
		pattern += "*"
	}
	p := []rune(pattern)
	var out hubPattern
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case '*':
			if len(out) == 0 || out[len(out)-1].kind != '*' {
				out = append(out, hubToken{kind: '*'})
			}
		case '?':
			out = append(out, hubToken{kind: '?'})
		case '[':
			tok, next, ok := compileClass(p, i+1)
			if !ok {
				out = append(out, hubToken{kind: 'c', lit: '['})
				continue
			}
			out = append(out, tok)
			i = next
		default:
			out = append(out, hubToken{kind: 'c', lit: c})
		}
	}
	return out
}

// compileClass reads a class starting after its "[" as CPython's fnmatch.translate does: a leading "!" negates,
// a "]" right after "[" or "[!" is a member, "a-z" is a range, a reversed range ("z-a") is dropped, and a class
// left with no members matches nothing (negated: any character). It returns the index of the closing "]".
func compileClass(p []rune, start int) (hubToken, int, bool) {
	j := start
	if j < len(p) && p[j] == '!' {
		j++
	}
	if j < len(p) && p[j] == ']' {
		j++
	}
	for j < len(p) && p[j] != ']' {
		j++
	}
	if j >= len(p) {
		return hubToken{}, 0, false
	}
	tok := hubToken{kind: '['}
	k := start
	if p[k] == '!' {
		tok.negate = true
		k++
	}
	for k < j {
		if k+2 < j && p[k+1] == '-' {
			if p[k] <= p[k+2] {
				tok.ranges = append(tok.ranges, [2]rune{p[k], p[k+2]})
			}
			k += 3
			continue
		}
		tok.ranges = append(tok.ranges, [2]rune{p[k], p[k]})
		k++
	}
	return tok, j, true
}

func (t hubToken) one(r rune) bool {
	switch t.kind {
	case '?':
		return true
	case 'c':
		return r == t.lit
	}
	in := false
	for _, rg := range t.ranges {
		if rg[0] <= r && r <= rg[1] {
			in = true
			break
		}
	}
	return in != t.negate
}

// match reports whether the whole of name matches, backtracking to the last "*" on a mismatch (enough, since "*"
// matches any run of characters).
func (hp hubPattern) match(name string) bool {
	s := []rune(strings.ReplaceAll(name, `\`, "/"))
	pi, si := 0, 0
	starP, starS := -1, 0
	for si < len(s) {
		if pi < len(hp) && hp[pi].kind == '*' {
			starP, starS = pi, si
			pi++
			continue
		}
		if pi < len(hp) && hp[pi].one(s[si]) {
			pi++
			si++
			continue
		}
		if starP < 0 {
			return false
		}
		starS++
		pi, si = starP+1, starS
	}
	for pi < len(hp) && hp[pi].kind == '*' {
		pi++
	}
	return pi == len(hp)
}

// hubMatch reports whether huggingface_hub's filter_repo_objects would let pattern select path.
func hubMatch(pattern, path string) bool { return compileHub(pattern).match(path) }
