package scan

import (
	"bufio"
	"bytes"
	"io"
)

// src is the pickle stream's read buffer: what bufio.Reader does, with the reads of the opcode loop (one opcode
// byte, a fixed-size argument) short enough to inline, since a dense pickle spends its time there.
type src struct {
	r        io.Reader
	buf      []byte
	pos, end int
	err      error
}

func newSrc(r io.Reader) *src { return &src{r: r, buf: make([]byte, 64<<10)} }

func (s *src) Reset(r io.Reader) { s.r, s.pos, s.end, s.err = r, 0, 0, nil }

func (s *src) Buffered() int { return s.end - s.pos }

// fill reads until n bytes are buffered (n at most the buffer's size) or the reader fails.
func (s *src) fill(n int) bool {
	if s.end-s.pos >= n {
		return true
	}
	s.end = copy(s.buf, s.buf[s.pos:s.end])
	s.pos = 0
	for empty := 0; s.end < n && s.err == nil; {
		m, err := s.r.Read(s.buf[s.end:])
		s.end += m
		switch {
		case err != nil:
			s.err = err
		case m == 0:
			if empty++; empty > 100 {
				s.err = io.ErrNoProgress
			}
		}
	}
	return s.end-s.pos >= n
}

func (s *src) ReadByte() (byte, error) {
	if s.pos == s.end && !s.fill(1) {
		return 0, io.ErrUnexpectedEOF
	}
	c := s.buf[s.pos]
	s.pos++
	return c, nil
}

// Peek returns the next n bytes without consuming them, valid until the next read; fewer with an error at the end.
func (s *src) Peek(n int) ([]byte, error) {
	if n > len(s.buf) {
		return nil, bufio.ErrBufferFull
	}
	if !s.fill(n) {
		return s.buf[s.pos:s.end], io.EOF
	}
	return s.buf[s.pos : s.pos+n], nil
}

func (s *src) Discard(n int) (int, error) {
	d := 0
	for n > 0 {
		if s.pos == s.end && !s.fill(1) {
			return d, io.ErrUnexpectedEOF
		}
		k := min(n, s.end-s.pos)
		s.pos += k
		n -= k
		d += k
	}
	return d, nil
}

// ReadSlice reads through delim as bufio.Reader.ReadSlice does: bufio.ErrBufferFull when a full buffer holds none.
func (s *src) ReadSlice(delim byte) ([]byte, error) {
	for scanned := 0; ; {
		if i := bytes.IndexByte(s.buf[s.pos+scanned:s.end], delim); i >= 0 {
			line := s.buf[s.pos : s.pos+scanned+i+1]
			s.pos += scanned + i + 1
			return line, nil
		}
		scanned = s.end - s.pos
		if scanned == len(s.buf) {
			line := s.buf[s.pos:s.end]
			s.pos = s.end
			return line, bufio.ErrBufferFull
		}
		if !s.fill(scanned + 1) {
			line := s.buf[s.pos:s.end]
			s.pos = s.end
			if s.err == nil {
				s.err = io.EOF
			}
			return line, s.err
		}
	}
}

// Read makes src an io.Reader for io.ReadFull of long arguments.
func (s *src) Read(p []byte) (int, error) {
	if s.pos == s.end && !s.fill(1) {
		if s.err == nil {
			return 0, io.EOF
		}
		return 0, s.err
	}
	n := copy(p, s.buf[s.pos:s.end])
	s.pos += n
	return n, nil
}
