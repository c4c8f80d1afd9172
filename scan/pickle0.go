package scan

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Protocol 0 and 1 carry numbers, strings and names as text lines: the decoders CPython applies to them.

// number checks a protocol-0 INT, LONG or FLOAT line as CPython parses it.
func (u *unpickler) number(op byte, line []byte) error {
	s := string(line)
	switch op {
	case opINT:
		if s == "00" || s == "01" {
			return nil
		}
		if _, ok := parsePyInt(s); !ok {
			return u.fail("invalid literal for int(): %q", s)
		}
	case opLONG:
		s = strings.TrimSuffix(s, "L")
		if _, ok := parsePyInt(s); !ok {
			return u.fail("invalid literal for int(): %q", s)
		}
	case opFLOAT:
		if _, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err != nil && !errors.Is(err, strconv.ErrRange) {
			return u.fail("could not convert string to float: %q", s)
		}
	}
	return nil
}

func parsePyInt(s string) (string, bool) {
	s = strings.TrimSpace(s)
	t := strings.TrimLeft(s, "+-")
	if len(s)-len(t) > 1 || t == "" {
		return "", false
	}
	for _, c := range t {
		if c < '0' || c > '9' {
			return "", false
		}
	}
	return s, true
}

// pushString is protocol 0's STRING: a quoted Python 2 string literal with backslash escapes.
func (u *unpickler) pushString() error {
	line, whole, err := u.readLine()
	if err != nil {
		return err
	}
	if !whole {
		return u.push(&pval{k: kStr})
	}
	if len(line) < 2 || line[0] != line[len(line)-1] || (line[0] != '\'' && line[0] != '"') {
		return u.fail("the STRING opcode argument must be quoted")
	}
	s, ok := escapeDecode(line[1 : len(line)-1])
	if !ok {
		return u.fail("invalid \\x escape in STRING")
	}
	v := &pval{k: kStr, whole: true, s: s}
	if len(s) > maxKeptString {
		v.s, v.whole = s[:16], false
	}
	return u.push(v)
}

// escapeDecode is codecs.escape_decode: Python string-literal escapes, everything else literal.
func escapeDecode(b []byte) (string, bool) {
	if bytes.IndexByte(b, '\\') < 0 {
		return string(b), true
	}
	var out []byte
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		if i == len(b) {
			return "", false // "\\ at end of string"
		}
		switch c = b[i]; c {
		case '\n':
		case '\\', '\'', '"':
			out = append(out, c)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 't':
			out = append(out, '\t')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 'v':
			out = append(out, '\v')
		case 'a':
			out = append(out, '\a')
		case '0', '1', '2', '3', '4', '5', '6', '7':
			v := int(c - '0')
			for j := 0; j < 2 && i+1 < len(b) && b[i+1] >= '0' && b[i+1] <= '7'; j++ {
				i++
				v = v*8 + int(b[i]-'0')
			}
			out = append(out, byte(v))
		case 'x':
			if i+2 >= len(b) {
				return "", false
			}
			v, err := strconv.ParseUint(string(b[i+1:i+3]), 16, 8)
			if err != nil {
				return "", false
			}
			out = append(out, byte(v))
			i += 2
		default:
			out = append(out, '\\', c)
		}
	}
	return string(out), true
}

// rawUnicodeEscape is the raw_unicode_escape codec: only \uXXXX and \UXXXXXXXX are escapes.
func rawUnicodeEscape(b []byte) (string, bool) {
	var out strings.Builder
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c == '\\' && i+1 < len(b) && (b[i+1] == 'u' || b[i+1] == 'U') {
			// An odd number of backslashes before u makes an escape; raw_unicode_escape counts only this one.
			n := 4
			if b[i+1] == 'U' {
				n = 8
			}
			if i+2+n > len(b) {
				return "", false
			}
			v, err := strconv.ParseUint(string(b[i+2:i+2+n]), 16, 32)
			if err != nil || v > utf8.MaxRune {
				return "", false
			}
			out.WriteRune(rune(v))
			i += 1 + n
			continue
		}
		out.WriteRune(rune(c)) // latin-1
	}
	return out.String(), true
}
