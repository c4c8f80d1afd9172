// Package scan tells, from a file's content alone, whether loading it can run code. Every model format a framework
// loads is recognised by its magic bytes and structure, never by its name, and given a verdict: data (safetensors,
// GGUF, ONNX without escaping external data, JSON, text, images, plain protobuf), code (a pickle naming anything
// outside a short allowlist, and everything that carries one: PyTorch ZIP and legacy archives, joblib, NumPy object
// arrays, Keras Lambda layers, TorchScript) or malformed (a structure loaders may read differently, or no known
// format). Nothing is ever executed, and every parser is bounded in the memory and work a hostile file can cost.
//
// A node scans each blob once, after it is verified: File reads safetensors and GGUF headers only and skips the
// tensor bytes inside a pickle, so the scan adds no read of the weights. A Report is JSON, to be kept with the blob
// under Version; signing.Policy.AllowsScan then decides, per file, whether the model may be mounted.
package scan

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// Version names the scanner's rules (formats, checks, the allowlist). A cached Report is valid only for the
// Version that made it: it changes whenever a verdict on some file can change.
const Version = "modelpack-scan/1"

// Verdict is what loading a file can do.
type Verdict string

const (
	// Data: loading it runs nothing the file chooses.
	Data Verdict = "data"
	// Code: loading it imports or calls what the file names (a pickle outside the allowlist, TorchScript, a Lambda).
	Code Verdict = "code"
	// Malformed: a structure the scanner refuses to vouch for: truncated, over a limit, ambiguous between loaders
	// (ZIP headers that disagree, overlapping tensors), or no format it knows. Treated like code by the policy.
	Malformed Verdict = "malformed"
)

// rank orders verdicts for a container: code names the payload, so it outranks malformed.
func (v Verdict) rank() int {
	switch v {
	case Code:
		return 2
	case Malformed:
		return 1
	}
	return 0
}

// Report is the verdict on one file.
type Report struct {
	// Format is what the content is: pickle, pytorch-zip, zip, npz, keras, npy, safetensors, gguf, onnx, hdf5, tar,
	// gzip, zstd, png, jpeg, protobuf, json, text, unknown.
	Format  string  `json:"format"`
	Verdict Verdict `json:"verdict"`
	// Reason is the first finding that decided the verdict, in words; empty for data.
	Reason string `json:"reason,omitempty"`
	// Findings lists what the scan found, in file order: every callable a pickle imports, every structural fault.
	Findings []Finding `json:"findings,omitempty"`
}

// Finding is one thing the scan found.
type Finding struct {
	// File is the model-relative path of the tar member the finding is in, when the scanned file is a tar layer
	// (its entries are the model's files); empty otherwise.
	File string `json:"file,omitempty"`
	// Member is the path inside a file that is itself a container (a ZIP's data.pkl); empty for the file itself.
	Member  string  `json:"member,omitempty"`
	Verdict Verdict `json:"verdict"`
	// Callable is the module.name a pickle imports or calls, when the finding is one.
	Callable string `json:"callable,omitempty"`
	Detail   string `json:"detail"`
}

func (f Finding) String() string {
	s := f.Detail
	if f.Member != "" {
		s = f.Member + ": " + s
	}
	if f.File != "" {
		s = f.File + ": " + s
	}
	return s
}

// FirstCallable is the first callable a code finding names, or "".
func (r Report) FirstCallable() string {
	for _, f := range r.Findings {
		if f.Verdict == Code && f.Callable != "" {
			return f.Callable
		}
	}
	return ""
}

// Limits bound what one file may cost. A hostile file costs at most the memory these allow (about 32 MiB for a
// pickle with the defaults: stack, memo and kept strings) and time linear in its size; past a limit the file is
// malformed, never trusted.
type Limits struct {
	// MaxDepth bounds containers inside containers (a pickle in a ZIP in a tar in a gzip is 3).
	MaxDepth int
	// MaxEntries bounds ZIP and tar members, safetensors and GGUF tensors, GGUF metadata keys.
	MaxEntries int
	// MaxHeader bounds a header read whole: safetensors (its own limit is 100 MB; streamed, not held), npy, ZIP
	// central directory, config.json inside a .keras.
	MaxHeader int64
	// MaxPickleStack and MaxMemo bound the symbolic unpickler: values are one shared word each unless they are
	// strings (MaxCapture) or names.
	MaxPickleStack int
	MaxMemo        int
	// MaxCapture bounds the string bytes a pickle scan keeps (for names built through the memo, nested pickles).
	MaxCapture int
	// MaxFindings bounds the findings kept per file (the verdict does not depend on it).
	MaxFindings int
	// MaxSpool bounds the decompressed bytes of a compressed member (gzip, zstd, deflated ZIP entry) written to a
	// temporary file to be scanned with random access.
	MaxSpool int64
	// HDF5Window is how far into an HDF5 file the search for a Keras model_config looks.
	HDF5Window int64
	// SpoolDir is where those temporary files go; empty is os.TempDir(). The node sets its cache root's own
	// scratch directory: a node plugin's root file system is read-only, and nothing of it is written elsewhere.
	SpoolDir string
}

// DefaultLimits are generous for real models and small for hostile ones.
var DefaultLimits = Limits{
	MaxDepth:       4,
	MaxEntries:     1 << 17,
	MaxHeader:      100 << 20,
	MaxPickleStack: 1 << 18,
	MaxMemo:        1 << 18,
	MaxCapture:     4 << 20,
	MaxFindings:    64,
	MaxSpool:       16 << 30,
	HDF5Window:     64 << 20,
}

// File scans the size bytes of r with DefaultLimits.
func File(r io.ReaderAt, size int64) Report { return DefaultLimits.File(r, size) }

// File scans the size bytes of r.
func (l Limits) File(r io.ReaderAt, size int64) Report {
	s := &scanner{lim: l}
	return s.file(r, size, 0)
}

type scanner struct {
	lim Limits
}

// result collects findings for one file and derives its verdict.
type result struct {
	format   string
	verdict  Verdict
	reason   string
	findings []Finding
	max      int
	dropped  bool
}

func newResult(format string, max int) *result {
	return &result{format: format, verdict: Data, max: max}
}

func (r *result) add(f Finding) {
	if f.Verdict.rank() > r.verdict.rank() {
		r.verdict, r.reason = f.Verdict, f.String()
	}
	if len(r.findings) < r.max {
		r.findings = append(r.findings, f)
	} else {
		r.dropped = true
	}
}

func (r *result) code(callable, detail string) {
	r.add(Finding{Verdict: Code, Callable: callable, Detail: detail})
}
func (r *result) malformed(format string, a ...any) {
	r.add(Finding{Verdict: Malformed, Detail: fmt.Sprintf(format, a...)})
}

// merge adds a member's report under its path.
func (r *result) merge(member string, m Report) {
	for _, f := range m.Findings {
		switch {
		case f.File != "" || member == "":
		case f.Member == "":
			f.Member = member
		default:
			f.Member = member + "/" + f.Member
		}
		r.add(f)
	}
	if m.Verdict != Data && len(m.Findings) == 0 { // a verdict always comes with a finding; keep it if cut
		r.add(Finding{Member: member, Verdict: m.Verdict, Detail: m.Reason})
	}
}

// mergeFile adds a tar member's report: its findings are in that model file.
func (r *result) mergeFile(file string, m Report) {
	for i := range m.Findings {
		if m.Findings[i].File == "" {
			m.Findings[i].File = file
		}
	}
	if m.Verdict != Data && len(m.Findings) == 0 {
		m.Findings = []Finding{{Verdict: m.Verdict, Detail: m.Reason}}
		m.Findings[0].File = file
	}
	r.merge("", m)
}

func (r *result) report() Report {
	rep := Report{Format: r.format, Verdict: r.verdict, Reason: r.reason, Findings: r.findings}
	if r.dropped {
		rep.Findings = append(rep.Findings, Finding{Verdict: r.verdict, Detail: "more findings not listed"})
	}
	return rep
}

var (
	magicZipLocal = []byte("PK\x03\x04")
	magicZipEnd   = []byte("PK\x05\x06")
	magicGzip     = []byte{0x1f, 0x8b}
	magicZstd     = []byte{0x28, 0xb5, 0x2f, 0xfd}
	magicHDF5     = []byte("\x89HDF\r\n\x1a\n")
	magicNpy      = []byte("\x93NUMPY")
	magicGGUF     = []byte("GGUF")
	magicPNG      = []byte("\x89PNG\r\n\x1a\n")
	magicJPEG     = []byte{0xff, 0xd8, 0xff}
)

// file detects the format of r from its content, in an order where no earlier format can hide a later one, and
// runs that format's parser.
func (s *scanner) file(r io.ReaderAt, size int64, depth int) Report {
	if depth > s.lim.MaxDepth {
		return malformedReport("unknown", fmt.Sprintf("containers nested deeper than %d", s.lim.MaxDepth))
	}
	head := make([]byte, 512)
	n, err := r.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return malformedReport("unknown", "read: "+err.Error())
	}
	head = head[:n]
	switch {
	case size == 0:
		return Report{Format: "empty", Verdict: Data}
	case bytes.HasPrefix(head, magicZipLocal) || bytes.HasPrefix(head, magicZipEnd):
		return s.zip(r, size, depth)
	case len(head) >= 262 && bytes.Equal(head[257:262], []byte("ustar")):
		return s.tar(r, size, depth)
	case bytes.HasPrefix(head, magicGzip):
		return s.compressed("gzip", r, size, depth)
	case bytes.HasPrefix(head, magicZstd):
		return s.compressed("zstd", r, size, depth)
	case bytes.HasPrefix(head, magicHDF5):
		return s.hdf5(r, size)
	case bytes.HasPrefix(head, magicNpy):
		return s.npy(r, size)
	case bytes.HasPrefix(head, magicGGUF):
		return s.gguf(r, size)
	case looksSafetensors(head, size):
		return s.safetensors(r, size)
	case bytes.HasPrefix(head, magicPNG):
		return Report{Format: "png", Verdict: Data}
	case bytes.HasPrefix(head, magicJPEG):
		return Report{Format: "jpeg", Verdict: Data}
	}
	// A file that is not a ZIP at its start but has a ZIP directory at its end is read as a ZIP by Python's zipfile
	// (and the scanners built on it) and as a pickle by torch.load and numpy.load: refuse the disagreement, and say
	// what the loaders that read the start would find.
	polyglot := hasZipEnd(r, size)
	rep, ok := s.pickleFile(r, size, depth)
	if !ok {
		rep = s.tail(r, size, head)
	}
	if polyglot {
		res := newResult(rep.Format, s.lim.MaxFindings)
		res.merge("", rep)
		res.malformed("a ZIP end-of-central-directory record behind non-ZIP content: zipfile and torch.load read different files")
		return res.report()
	}
	return rep
}

// tail is detection after pickle: ONNX and other protobuf, JSON, text, or nothing known.
func (s *scanner) tail(r io.ReaderAt, size int64, head []byte) Report {
	if rep, ok := s.onnx(r, size); ok {
		return rep
	}
	if isUTF8(r, size) {
		if isJSON(r, size) {
			return Report{Format: "json", Verdict: Data}
		}
		return Report{Format: "text", Verdict: Data}
	}
	if isProtobuf(r, size) {
		return Report{Format: "protobuf", Verdict: Data}
	}
	return malformedReport("unknown", "unrecognised binary format")
}

func malformedReport(format, reason string) Report {
	return Report{Format: format, Verdict: Malformed, Reason: reason, Findings: []Finding{{Verdict: Malformed, Detail: reason}}}
}

// isUTF8 reads the whole file once in chunks.
func isUTF8(r io.ReaderAt, size int64) bool {
	buf := make([]byte, min(size+utf8.UTFMax, 64<<10))
	var carry int
	for off := int64(0); off < size; {
		n, err := r.ReadAt(buf[carry:], off)
		if n == 0 && err != nil {
			return false
		}
		off += int64(n)
		chunk := buf[:carry+n]
		// Keep an incomplete trailing rune for the next chunk.
		end := len(chunk)
		if off < size {
			for i := 1; i <= utf8.UTFMax && i <= len(chunk); i++ {
				if utf8.RuneStart(chunk[len(chunk)-i]) {
					if !utf8.FullRune(chunk[len(chunk)-i:]) {
						end = len(chunk) - i
					}
					break
				}
			}
		}
		if !utf8.Valid(chunk[:end]) {
			return false
		}
		carry = copy(buf, chunk[end:])
	}
	return carry == 0
}
