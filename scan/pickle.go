package scan

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The pickle reader is a symbolic unpickler: it runs the opcode stream as CPython's _pickle.c does (the same stack,
// mark stack and memo, the same errors at the same opcodes), with values reduced to what decides a verdict: strings
// (names are built from them through the memo), imported globals, and the results of calls. Every import is
// reported; a call, class instantiation or attribute write on anything outside the allowlist is code. CPython runs
// each opcode as it reads it, so what was imported before a stream turns malformed was imported: a payload followed
// by garbage is code.

type pkind uint8

const (
	kOther  pkind = iota // anything whose value does not matter: numbers, containers, None
	kStr                 // a str (or a protocol 0/1 string, which torch.load decodes to str)
	kBytes               // bytes or bytearray
	kGlobal              // an imported module attribute
	kObj                 // the result of calling or instantiating a global
	kLong                // a LONG1/LONG4 integer, kept when short (the legacy torch magic number is one)
	kPersid              // what persistent_load returned (a torch storage)
)

type pval struct {
	k pkind
	// s is a string's content (whole or a prefix), a global's or a call's module.name, a short integer's bytes.
	s     string
	whole bool
}

var (
	vOther  = &pval{k: kOther}
	vPersid = &pval{k: kPersid}
)

// legacyMagic is torch's legacy-format magic number 0x1950a86a20f9469cfc6c, as LONG1 bytes (little endian).
const legacyMagic = "\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"

// maxLine bounds a protocol-0 opcode line kept in memory; longer lines are read through.
const (
	maxLine       = 1 << 20
	maxKeptString = 256 // strings up to this length are kept while the capture budget lasts (names, keys)
	maxNested     = 8   // nested pickle candidates kept per file
	maxPickles    = 64  // pickles read back to back from one file (torch's legacy format has 5)
	pickleDepth   = 3   // nested pickles inside pickles
)

type unpickler struct {
	r     *src
	ra    io.ReaderAt // the stream's bytes at random offsets, when it has them
	off   int64
	size  int64 // bytes available from the start of the stream; -1 when unknown
	lim   *Limits
	res   *result
	proto int

	stack   []*pval
	meta    []int
	scratch [8]byte
	memo    []*pval
	memoMap map[uint64]*pval
	memoLen int

	captured int
	seen     map[string]bool // callables already reported
	nested   []string
	globals  int
	calls    int
}

var errNotPickle = errors.New("not a pickle")

type pickleErr struct {
	off int64
	msg string
}

func (e *pickleErr) Error() string { return fmt.Sprintf("at byte %d: %s", e.off, e.msg) }

func (u *unpickler) fail(format string, a ...any) error {
	return &pickleErr{off: u.off, msg: fmt.Sprintf(format, a...)}
}

// pickleFile scans r as a pickle; ok is false when it is not one (the detection falls through to text formats).
func (s *scanner) pickleFile(r io.ReaderAt, size int64, depth int) (Report, bool) {
	head := make([]byte, 2)
	if n, _ := r.ReadAt(head, 0); n < 1 || !isOpcode(head[0]) {
		return Report{}, false
	}
	return s.pickleStream(io.NewSectionReader(r, 0, size), size, depth, false)
}

// pickleStream reads a stream a loader will unpickle whatever it holds (a ZIP's data.pkl): force says a stream
// that is no pickle is malformed rather than "not a pickle".
func (s *scanner) pickleStream(rd io.Reader, size int64, depth int, force bool) (Report, bool) {
	res := newResult("pickle", s.lim.MaxFindings)
	u := &unpickler{r: newSrc(rd), size: size, lim: &s.lim, res: res, seen: map[string]bool{}}
	if ra, ok := rd.(io.ReaderAt); ok && size >= 0 { // a file (section): payloads are skipped, not read
		u.ra = ra
	}
	started := false
	if b, err := u.r.Peek(2); err == nil && b[0] == 0x80 && b[1] <= 5 {
		started = true
	}
	top, err := u.load()
	// A stream with no PROTO is a pickle when it is one to its STOP, or when it calls what it imported before it
	// fails (a protocol-0 payload followed by garbage). A text file that merely starts like GLOBAL ("copyright\nMIT\n")
	// and then stops parsing is text: nothing unpickles it.
	isPickle := started || err == nil || u.calls > 0
	if !isPickle && !force {
		return Report{}, false
	}
	if err != nil {
		res.malformed("pickle stream %v", err)
	} else {
		u.rest(top)
	}
	if res.verdict == Code {
		u.scanNested(s, depth)
	}
	return res.report(), true
}

// rest reads what follows the first pickle: torch's legacy format (magic number, protocol, sys info, the model,
// storage keys, then raw storages), or more pickles a loader may read back to back (joblib, repeated pickle.load).
func (u *unpickler) rest(first *pval) {
	if first.k == kLong && first.s == legacyMagic {
		u.res.format = "pytorch-legacy"
		for i := 0; i < 4; i++ {
			u.reset()
			if _, err := u.load(); err != nil {
				u.res.malformed("legacy torch archive, pickle %d: %v", i+2, err)
				return
			}
		}
		return // raw storage bytes follow, read by torch as bytes
	}
	for i := 1; i < maxPickles; i++ {
		b, err := u.r.Peek(2)
		if err != nil || b[0] != 0x80 || b[1] < 2 || b[1] > 5 {
			return
		}
		u.reset()
		if _, err := u.load(); err != nil {
			return // trailing bytes that only resemble a pickle: nothing loads them as one
		}
	}
}

func (u *unpickler) reset() {
	u.stack, u.meta, u.memo, u.memoMap, u.memoLen, u.proto = u.stack[:0], u.meta[:0], nil, nil, 0, 0
}

func (u *unpickler) scanNested(s *scanner, depth int) {
	if depth >= pickleDepth {
		return
	}
	for _, n := range u.nested {
		sub, ok := s.pickleStream(strings.NewReader(n), int64(len(n)), depth+1, false)
		if !ok {
			continue
		}
		for _, f := range sub.Findings {
			if f.Verdict == Code {
				f.Detail = "in a nested pickle: " + f.Detail
				u.res.add(f)
			}
		}
	}
}

// Opcodes (Lib/pickle.py names).
const (
	opMARK             = '('
	opSTOP             = '.'
	opPOP              = '0'
	opPOP_MARK         = '1'
	opDUP              = '2'
	opFLOAT            = 'F'
	opINT              = 'I'
	opBININT           = 'J'
	opBININT1          = 'K'
	opLONG             = 'L'
	opBININT2          = 'M'
	opNONE             = 'N'
	opPERSID           = 'P'
	opBINPERSID        = 'Q'
	opREDUCE           = 'R'
	opSTRING           = 'S'
	opBINSTRING        = 'T'
	opSHORT_BINSTRING  = 'U'
	opUNICODE          = 'V'
	opBINUNICODE       = 'X'
	opAPPEND           = 'a'
	opBUILD            = 'b'
	opGLOBAL           = 'c'
	opDICT             = 'd'
	opEMPTY_DICT       = '}'
	opAPPENDS          = 'e'
	opGET              = 'g'
	opBINGET           = 'h'
	opINST             = 'i'
	opLONG_BINGET      = 'j'
	opLIST             = 'l'
	opEMPTY_LIST       = ']'
	opOBJ              = 'o'
	opPUT              = 'p'
	opBINPUT           = 'q'
	opLONG_BINPUT      = 'r'
	opSETITEM          = 's'
	opTUPLE            = 't'
	opEMPTY_TUPLE      = ')'
	opSETITEMS         = 'u'
	opBINFLOAT         = 'G'
	opPROTO            = 0x80
	opNEWOBJ           = 0x81
	opEXT1             = 0x82
	opEXT2             = 0x83
	opEXT4             = 0x84
	opTUPLE1           = 0x85
	opTUPLE2           = 0x86
	opTUPLE3           = 0x87
	opNEWTRUE          = 0x88
	opNEWFALSE         = 0x89
	opLONG1            = 0x8a
	opLONG4            = 0x8b
	opBINBYTES         = 'B'
	opSHORT_BINBYTES   = 'C'
	opSHORT_BINUNICODE = 0x8c
	opBINUNICODE8      = 0x8d
	opBINBYTES8        = 0x8e
	opEMPTY_SET        = 0x8f
	opADDITEMS         = 0x90
	opFROZENSET        = 0x91
	opNEWOBJ_EX        = 0x92
	opSTACK_GLOBAL     = 0x93
	opMEMOIZE          = 0x94
	opFRAME            = 0x95
	opBYTEARRAY8       = 0x96
	opNEXT_BUFFER      = 0x97
	opREADONLY_BUFFER  = 0x98
)

func isOpcode(b byte) bool {
	if b >= 0x80 {
		return b <= 0x98
	}
	return strings.IndexByte("(.012FIJKLMNPQRSTUVXabc}deghijl]opqrst)uGBC", b) >= 0
}

func (u *unpickler) readByte() (byte, error) {
	if r := u.r; r.pos < r.end {
		c := r.buf[r.pos]
		r.pos++
		u.off++
		return c, nil
	}
	b, err := u.r.ReadByte()
	if err != nil {
		return 0, u.fail("pickle data was truncated")
	}
	u.off++
	return b, nil
}

// readN reads n bytes; up to 8 land in a scratch buffer valid until the next read.
func (u *unpickler) readN(n int) ([]byte, error) {
	if r := u.r; n <= len(u.scratch) && r.end-r.pos >= n {
		b := u.scratch[:copy(u.scratch[:], r.buf[r.pos:r.pos+n])]
		r.pos += n
		u.off += int64(n)
		return b, nil
	}
	if n <= len(u.scratch) {
		p, err := u.r.Peek(n)
		if err != nil {
			return nil, u.fail("pickle data was truncated")
		}
		b := u.scratch[:copy(u.scratch[:], p)]
		u.r.Discard(n)
		u.off += int64(n)
		return b, nil
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(u.r, b); err != nil {
		return nil, u.fail("pickle data was truncated")
	}
	u.off += int64(n)
	return b, nil
}

// readLine returns a line without its newline (up to maxLine bytes kept; whole says none were dropped).
func (u *unpickler) readLine() (line []byte, whole bool, err error) {
	whole = true
	for {
		frag, e := u.r.ReadSlice('\n')
		u.off += int64(len(frag))
		if len(line)+len(frag) <= maxLine {
			line = append(line, frag...)
		} else {
			whole = false
		}
		if e == nil {
			if whole {
				line = line[:len(line)-1]
			}
			return line, whole, nil
		}
		if !errors.Is(e, bufio.ErrBufferFull) {
			return nil, false, u.fail("pickle data was truncated")
		}
	}
}

// str reads a length-prefixed string payload, keeping it when short (or when it may be a nested pickle).
func (u *unpickler) str(k pkind, n uint64) (*pval, error) {
	if u.size >= 0 && n > uint64(u.size-u.off) {
		return nil, u.fail("pickle data was truncated (a %d-byte string)", n)
	}
	keep := n <= maxKeptString && u.captured+int(n) <= u.lim.MaxCapture
	if !keep && n <= 1<<20 && u.captured+int(n) <= u.lim.MaxCapture && len(u.nested) < maxNested {
		if b, err := u.r.Peek(3); err == nil && nestedPickle(b) != "" {
			keep = true
		}
	}
	if keep {
		b, err := u.readN(int(n))
		if err != nil {
			return nil, err
		}
		u.captured += int(n)
		if p := nestedPickle(b); p != "" && len(u.nested) < maxNested {
			u.nested = append(u.nested, p)
		}
		return &pval{k: k, s: string(b), whole: true}, nil
	}
	// Skip it without keeping it: weights inside a pickle stream cost no memory, and in a file no reads.
	pre, _ := u.r.Peek(min(int(min(n, 16)), 16))
	v := &pval{k: k, s: string(pre)}
	if u.ra != nil && n > uint64(u.r.Buffered()) {
		u.off += int64(n)
		u.r.Reset(io.NewSectionReader(u.ra, u.off, u.size-u.off))
		return v, nil
	}
	for left := n; left > 0; {
		step := int(min(left, 1<<30))
		d, err := u.r.Discard(step)
		u.off += int64(d)
		if err != nil {
			return nil, u.fail("pickle data was truncated")
		}
		left -= uint64(d)
	}
	return v, nil
}

// The stack is one slice; marks are positions in it (CPython's fence): values below the last mark are out of
// reach until POP_MARK or an opcode that pops to the mark.
func (u *unpickler) fence() int {
	if len(u.meta) == 0 {
		return 0
	}
	return u.meta[len(u.meta)-1]
}

func (u *unpickler) push(v *pval) error {
	if len(u.stack)+len(u.meta) >= u.lim.MaxPickleStack {
		return u.fail("stack over %d items (limit)", u.lim.MaxPickleStack)
	}
	u.stack = append(u.stack, v)
	return nil
}

func (u *unpickler) pop() (*pval, error) {
	if len(u.stack) <= u.fence() {
		return nil, u.fail("unpickling stack underflow")
	}
	v := u.stack[len(u.stack)-1]
	u.stack = u.stack[:len(u.stack)-1]
	return v, nil
}

func (u *unpickler) top() (*pval, error) {
	if len(u.stack) <= u.fence() {
		return nil, u.fail("unpickling stack underflow")
	}
	return u.stack[len(u.stack)-1], nil
}

func (u *unpickler) mark() error {
	if len(u.stack)+len(u.meta) >= u.lim.MaxPickleStack {
		return u.fail("stack over %d items (limit)", u.lim.MaxPickleStack)
	}
	u.meta = append(u.meta, len(u.stack))
	return nil
}

// popMark returns the values above the last mark (valid until the next push) and drops them and the mark.
func (u *unpickler) popMark() ([]*pval, error) {
	if len(u.meta) == 0 {
		return nil, u.fail("could not find MARK")
	}
	m := u.meta[len(u.meta)-1]
	u.meta = u.meta[:len(u.meta)-1]
	items := u.stack[m:]
	u.stack = u.stack[:m]
	return items, nil
}

func (u *unpickler) memoPut(idx uint64, v *pval) error {
	if u.memoLen >= u.lim.MaxMemo {
		return u.fail("memo over %d entries (limit)", u.lim.MaxMemo)
	}
	if idx < uint64(len(u.memo))+1024 && idx < uint64(u.lim.MaxMemo) {
		for uint64(len(u.memo)) <= idx {
			u.memo = append(u.memo, nil)
		}
		if u.memo[idx] == nil {
			u.memoLen++
		}
		u.memo[idx] = v
		return nil
	}
	if u.memoMap == nil {
		u.memoMap = map[uint64]*pval{}
	}
	if _, ok := u.memoMap[idx]; !ok {
		u.memoLen++
	}
	u.memoMap[idx] = v
	return nil
}

func (u *unpickler) memoGet(idx uint64) (*pval, error) {
	if idx < uint64(len(u.memo)) && u.memo[idx] != nil {
		return u.memo[idx], nil
	}
	if v, ok := u.memoMap[idx]; ok {
		return v, nil
	}
	return nil, u.fail("Memo value not found at index %d", idx)
}

// python2Modules is CPython's fix_imports mapping (Lib/_compat_pickle.py) for protocols < 3, where a name decides
// the verdict or the report.
var python2Modules = map[string]string{
	"__builtin__": "builtins", "copy_reg": "copyreg", "cPickle": "pickle", "exceptions": "builtins",
	"UserDict": "collections", "UserList": "collections", "UserString": "collections", "commands": "subprocess",
}

// importGlobal is find_class: report the import and push the attribute.
func (u *unpickler) importGlobal(module, name, how string) (*pval, error) {
	if u.proto < 3 {
		if m, ok := python2Modules[module]; ok {
			module = m
		}
	}
	if !dotted(module) {
		return nil, u.fail("%s: No module named %q", how, module)
	}
	full := module + "." + name
	u.globals++
	if !dotted(name) {
		// __import__ has run the module's code by the time the attribute lookup fails.
		u.report(module, fmt.Sprintf("%s imports module %s (attribute %q then fails)", how, module, name))
		return nil, u.fail("%s: Can't get attribute %q on module %s", how, name, module)
	}
	if why, ok := allowed[full]; ok {
		if !u.seen[full] && len(u.seen) < 4*u.lim.MaxFindings {
			u.seen[full] = true
			u.res.add(Finding{Verdict: Data, Callable: full, Detail: "imports " + full + " (allowed: " + why + ")"})
		}
	} else {
		u.report(full, fmt.Sprintf("%s imports %s, which is not on the allowlist", how, full))
	}
	return &pval{k: kGlobal, s: full}, nil
}

func (u *unpickler) report(callable, detail string) {
	if u.seen[callable] {
		return
	}
	if len(u.seen) < 4*u.lim.MaxFindings {
		u.seen[callable] = true
	}
	u.res.code(callable, detail)
}

// call is a REDUCE, NEWOBJ, OBJ or INST of fn: data only when fn is an allowlisted global.
func (u *unpickler) call(fn *pval, how string) (*pval, error) {
	u.calls++
	switch fn.k {
	case kGlobal:
		return &pval{k: kObj, s: fn.s}, nil // an import outside the allowlist was reported when it was made
	case kObj:
		u.report(fn.s+"(…)", fmt.Sprintf("%s calls what %s returned", how, fn.s))
		return &pval{k: kObj, s: fn.s + "(…)"}, nil
	default:
		u.report("(computed)", fmt.Sprintf("%s calls a value that is not an imported global", how))
	}
	return &pval{k: kObj, s: "(computed)"}, nil
}

// onto is an opcode that writes into target (BUILD's setstate/setattr, APPEND, SETITEM, ADDITEMS): on an imported
// global itself rather than an instance, that rewrites module state (a function's __defaults__, a class's
// methods), so it is code.
func (u *unpickler) onto(target *pval, how string) {
	if target.k == kGlobal {
		u.report(target.s+" ("+how+")", fmt.Sprintf("%s writes into %s itself, not an instance", how, target.s))
	}
}

func dotted(s string) bool {
	if s == "" {
		return false
	}
	for _, part := range strings.Split(s, ".") {
		if part == "" {
			return false
		}
		for i, r := range part {
			switch {
			case r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= utf8.RuneSelf && r != utf8.RuneError:
			case r >= '0' && r <= '9' && i > 0:
			default:
				return false
			}
		}
	}
	return true
}

// load runs one pickle to its STOP and returns the value it stops with.
func (u *unpickler) load() (*pval, error) {
	for {
		op, err := u.readByte()
		if err != nil {
			return nil, err
		}
		switch op {
		case opPROTO:
			b, err := u.readByte()
			if err != nil {
				return nil, err
			}
			if b > 5 {
				return nil, u.fail("unsupported pickle protocol: %d", b)
			}
			u.proto = int(b)
		case opFRAME:
			b, err := u.readN(8)
			if err != nil {
				return nil, err
			}
			n := binary.LittleEndian.Uint64(b)
			if n > math.MaxInt64 || u.size >= 0 && n > uint64(u.size-u.off) {
				return nil, u.fail("pickle data was truncated (a frame of %d bytes)", n)
			}
		case opSTOP:
			v, err := u.pop()
			if err != nil {
				return nil, err
			}
			return v, nil
		case opMARK:
			err = u.mark()
		case opPOP:
			if len(u.stack) > u.fence() {
				_, err = u.pop()
			} else {
				_, err = u.popMark()
			}
		case opPOP_MARK:
			_, err = u.popMark()
		case opDUP:
			var v *pval
			if v, err = u.top(); err == nil {
				err = u.push(v)
			}
		case opNONE, opNEWTRUE, opNEWFALSE, opEMPTY_DICT, opEMPTY_LIST, opEMPTY_TUPLE, opEMPTY_SET:
			err = u.push(vOther)
		case opBININT:
			if _, err = u.readN(4); err == nil {
				err = u.push(vOther)
			}
		case opBININT1:
			if _, err = u.readN(1); err == nil {
				err = u.push(vOther)
			}
		case opBININT2:
			if _, err = u.readN(2); err == nil {
				err = u.push(vOther)
			}
		case opBINFLOAT:
			if _, err = u.readN(8); err == nil {
				err = u.push(vOther)
			}
		case opLONG1, opLONG4:
			var n uint64
			if op == opLONG1 {
				var b byte
				b, err = u.readByte()
				n = uint64(b)
			} else {
				var b []byte
				if b, err = u.readN(4); err == nil {
					if int32(binary.LittleEndian.Uint32(b)) < 0 {
						return nil, u.fail("LONG pickle has negative byte count")
					}
					n = uint64(binary.LittleEndian.Uint32(b))
				}
			}
			if err != nil {
				return nil, err
			}
			var v *pval
			if v, err = u.str(kLong, n); err == nil {
				err = u.push(v)
			}
		case opINT, opLONG, opFLOAT:
			var line []byte
			if line, _, err = u.readLine(); err != nil {
				return nil, err
			}
			if err = u.number(op, line); err == nil {
				err = u.push(vOther)
			}
		case opSTRING:
			err = u.pushString()
		case opUNICODE:
			line, whole, e := u.readLine()
			if e != nil {
				return nil, e
			}
			v := &pval{k: kStr, whole: whole}
			if whole {
				if s, ok := rawUnicodeEscape(line); ok {
					v.s = s
				} else {
					return nil, u.fail("'rawunicodeescape' codec can't decode bytes")
				}
			}
			err = u.push(v)
		case opBINSTRING, opBINUNICODE, opBINBYTES:
			var b []byte
			if b, err = u.readN(4); err != nil {
				return nil, err
			}
			n := binary.LittleEndian.Uint32(b)
			if op == opBINSTRING && int32(n) < 0 {
				return nil, u.fail("BINSTRING pickle has negative byte count")
			}
			k := kStr
			if op == opBINBYTES {
				k = kBytes
			}
			var v *pval
			if v, err = u.str(k, uint64(n)); err == nil {
				err = u.push(v)
			}
		case opSHORT_BINSTRING, opSHORT_BINBYTES, opSHORT_BINUNICODE:
			var b byte
			if b, err = u.readByte(); err != nil {
				return nil, err
			}
			k := kStr
			if op == opSHORT_BINBYTES {
				k = kBytes
			}
			var v *pval
			if v, err = u.str(k, uint64(b)); err == nil {
				err = u.push(v)
			}
		case opBINUNICODE8, opBINBYTES8, opBYTEARRAY8:
			var b []byte
			if b, err = u.readN(8); err != nil {
				return nil, err
			}
			n := binary.LittleEndian.Uint64(b)
			if n > math.MaxInt64 {
				return nil, u.fail("%d-byte string is too large", n)
			}
			k := kBytes
			if op == opBINUNICODE8 {
				k = kStr
			}
			var v *pval
			if v, err = u.str(k, n); err == nil {
				err = u.push(v)
			}
		case opNEXT_BUFFER:
			return nil, u.fail("pickle stream refers to out-of-band data but no *buffers* argument was given")
		case opREADONLY_BUFFER:
			_, err = u.top()
		case opTUPLE, opLIST, opDICT, opFROZENSET:
			if _, err = u.popMark(); err == nil {
				err = u.push(vOther)
			}
		case opTUPLE1, opTUPLE2, opTUPLE3:
			for i := 0; i < int(op-opTUPLE1)+1 && err == nil; i++ {
				_, err = u.pop()
			}
			if err == nil {
				err = u.push(vOther)
			}
		case opAPPEND, opSETITEM:
			n := 1
			if op == opSETITEM {
				n = 2
			}
			for i := 0; i < n && err == nil; i++ {
				_, err = u.pop()
			}
			var t *pval
			if err == nil {
				if t, err = u.top(); err == nil {
					u.onto(t, opName(op))
				}
			}
		case opAPPENDS, opSETITEMS, opADDITEMS:
			var t *pval
			if _, err = u.popMark(); err == nil {
				if t, err = u.top(); err == nil {
					u.onto(t, opName(op))
				}
			}
		case opPUT:
			line, _, e := u.readLine()
			if e != nil {
				return nil, e
			}
			idx, e := strconv.ParseInt(string(line), 10, 64)
			if e != nil {
				return nil, u.fail("invalid PUT argument %q", line)
			}
			if idx < 0 {
				return nil, u.fail("negative PUT argument")
			}
			err = u.put(uint64(idx))
		case opBINPUT:
			var b byte
			if b, err = u.readByte(); err == nil {
				err = u.put(uint64(b))
			}
		case opLONG_BINPUT:
			var b []byte
			if b, err = u.readN(4); err == nil {
				err = u.put(uint64(binary.LittleEndian.Uint32(b)))
			}
		case opMEMOIZE:
			err = u.put(uint64(u.memoLen))
		case opGET:
			line, _, e := u.readLine()
			if e != nil {
				return nil, e
			}
			idx, e := strconv.ParseInt(string(line), 10, 64)
			if e != nil || idx < 0 {
				return nil, u.fail("invalid GET argument %q", line)
			}
			err = u.get(uint64(idx))
		case opBINGET:
			var b byte
			if b, err = u.readByte(); err == nil {
				err = u.get(uint64(b))
			}
		case opLONG_BINGET:
			var b []byte
			if b, err = u.readN(4); err == nil {
				err = u.get(uint64(binary.LittleEndian.Uint32(b)))
			}
		case opGLOBAL, opINST:
			how := opName(op)
			mod, mw, e := u.readLine()
			if e != nil {
				return nil, e
			}
			name, nw, e := u.readLine()
			if e != nil {
				return nil, e
			}
			if !mw || !nw {
				return nil, u.fail("%s: name over %d bytes", how, maxLine)
			}
			g, e := u.importGlobal(string(mod), string(name), how)
			if e != nil {
				return nil, e
			}
			if op == opGLOBAL {
				err = u.push(g)
				break
			}
			if _, err = u.popMark(); err == nil {
				var v *pval
				if v, err = u.call(g, how); err == nil {
					err = u.push(v)
				}
			}
		case opSTACK_GLOBAL:
			name, e := u.pop()
			if e != nil {
				return nil, e
			}
			mod, e := u.pop()
			if e != nil {
				return nil, e
			}
			if mod.k != kStr || name.k != kStr {
				return nil, u.fail("STACK_GLOBAL requires str")
			}
			if !mod.whole || !name.whole {
				u.report("(unknown)", "STACK_GLOBAL imports a name longer than the scan keeps: "+mod.s+"…")
				err = u.push(&pval{k: kGlobal, s: "(unknown)"})
				break
			}
			g, e := u.importGlobal(mod.s, name.s, "STACK_GLOBAL")
			if e != nil {
				return nil, e
			}
			err = u.push(g)
		case opEXT1, opEXT2, opEXT4:
			n := map[byte]int{opEXT1: 1, opEXT2: 2, opEXT4: 4}[op]
			b, e := u.readN(n)
			if e != nil {
				return nil, e
			}
			var code uint32
			for i := n - 1; i >= 0; i-- {
				code = code<<8 | uint32(b[i])
			}
			if code == 0 || op == opEXT4 && int32(code) < 0 {
				return nil, u.fail("EXT specifies code <= 0")
			}
			name := fmt.Sprintf("(copyreg extension %d)", code)
			u.globals++
			u.report(name, fmt.Sprintf("%s imports extension code %d: whatever the loading process registered with copyreg.add_extension", opName(op), code))
			err = u.push(&pval{k: kGlobal, s: name})
		case opREDUCE:
			if _, err = u.pop(); err != nil {
				return nil, err
			}
			fn, e := u.pop()
			if e != nil {
				return nil, e
			}
			var v *pval
			if v, err = u.call(fn, "REDUCE"); err == nil {
				err = u.push(v)
			}
		case opNEWOBJ, opNEWOBJ_EX:
			n := 1
			if op == opNEWOBJ_EX {
				n = 2
			}
			for i := 0; i < n && err == nil; i++ {
				_, err = u.pop()
			}
			if err != nil {
				return nil, err
			}
			cls, e := u.pop()
			if e != nil {
				return nil, e
			}
			var v *pval
			if v, err = u.call(cls, opName(op)); err == nil {
				err = u.push(v)
			}
		case opOBJ:
			items, e := u.popMark()
			if e != nil {
				return nil, e
			}
			if len(items) == 0 {
				return nil, u.fail("OBJ: could not find class")
			}
			var v *pval
			if v, err = u.call(items[0], "OBJ"); err == nil {
				err = u.push(v)
			}
		case opBUILD:
			if _, err = u.pop(); err != nil {
				return nil, err
			}
			var t *pval
			if t, err = u.top(); err == nil {
				u.onto(t, "BUILD")
			}
		case opPERSID:
			if _, _, err = u.readLine(); err == nil {
				err = u.push(vPersid)
			}
		case opBINPERSID:
			if _, err = u.pop(); err == nil {
				err = u.push(vPersid)
			}
		default:
			return nil, u.fail("invalid load key, %q", op)
		}
		if err != nil {
			return nil, err
		}
	}
}

func (u *unpickler) put(idx uint64) error {
	v, err := u.top()
	if err != nil {
		return err
	}
	return u.memoPut(idx, v)
}

func (u *unpickler) get(idx uint64) error {
	v, err := u.memoGet(idx)
	if err != nil {
		return err
	}
	return u.push(v)
}

func opName(op byte) string {
	names := map[byte]string{
		opGLOBAL: "GLOBAL", opINST: "INST", opOBJ: "OBJ", opREDUCE: "REDUCE", opNEWOBJ: "NEWOBJ",
		opNEWOBJ_EX: "NEWOBJ_EX", opBUILD: "BUILD", opAPPEND: "APPEND", opAPPENDS: "APPENDS",
		opSETITEM: "SETITEM", opSETITEMS: "SETITEMS", opADDITEMS: "ADDITEMS", opEXT1: "EXT1", opEXT2: "EXT2",
		opEXT4: "EXT4",
	}
	if n, ok := names[op]; ok {
		return n
	}
	return fmt.Sprintf("opcode %#x", op)
}

// nestedPickle returns b as pickle bytes when it starts like one: raw, or as the UTF-8 of the text protocol 2
// writes bytes as (_codecs.encode(text, 'latin1'), so \x80 arrives as U+0080).
func nestedPickle(b []byte) string {
	switch {
	case len(b) > 2 && b[0] == 0x80 && b[1] <= 5:
		return string(b)
	case len(b) > 3 && b[0] == 0xc2 && b[1] == 0x80:
		out := make([]byte, 0, len(b))
		for _, r := range string(b) {
			if r > 0xff {
				return ""
			}
			out = append(out, byte(r))
		}
		if len(out) > 2 && out[1] <= 5 {
			return string(out)
		}
	}
	return ""
}
