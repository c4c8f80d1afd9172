package testenv

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// StallMode is how a StallServer treats a request it does not answer.
type StallMode int

const (
	// StallAll answers nothing at all: a registry that accepts connections and never says a word.
	StallAll StallMode = iota
	// StallBlobs answers the API ping and manifests it was given, and never answers a blob GET.
	StallBlobs
	// StallBlobBodies answers the API ping and manifests, and answers a blob GET with the headers of a 200 and
	// the blob's Content-Length, then sends nothing.
	StallBlobBodies
	// StallManifestBodies answers the API ping, and a manifest request with the headers of a 200 and the
	// manifest's Content-Length, then sends nothing.
	StallManifestBodies
)

// StallServer is the registry an attacker (or a wedged proxy) runs: a raw TCP server speaking HTTP/1.1 by hand,
// keeping every connection it stalls open until the client hangs up or the test ends. Manifests given to Serve
// are answered (HEAD and GET, by tag or digest) in modes other than StallAll, so a client gets as far as the
// blobs.
type StallServer struct {
	Host string // 127.0.0.1:port
	Mode StallMode

	ln        net.Listener
	requests  chan string // "METHOD path" of each request read
	hangups   chan string // "METHOD path" of each stalled request whose client hung up
	extra     atomic.Int64
	mu        sync.Mutex
	manifests map[string]stallManifest // by tag and by digest
	sizes     map[digest.Digest]int64
	given     map[digest.Digest][]byte
	conns     []net.Conn
}

type stallManifest struct {
	mediaType string
	body      []byte
}

// StartStallServer listens on a free loopback port until test end, when the listener and every connection are
// closed and their goroutines have returned.
func StartStallServer(t testing.TB, mode StallMode) *StallServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &StallServer{Host: ln.Addr().String(), Mode: mode, ln: ln, requests: make(chan string, 1024),
		hangups: make(chan string, 1024), manifests: map[string]stallManifest{}, sizes: map[digest.Digest]int64{},
		given: map[digest.Digest][]byte{}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		wg.Wait()
	})
	return s
}

// Serve makes the server answer a manifest under tag and its digest, and learn the sizes of the blobs it lists.
func (s *StallServer) Serve(tag, mediaType string, body []byte) digest.Digest {
	var m ocispec.Manifest
	_ = json.Unmarshal(body, &m)
	d := digest.FromBytes(body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.manifests[tag] = stallManifest{mediaType, body}
	s.manifests[d.String()] = stallManifest{mediaType, body}
	for _, b := range append([]ocispec.Descriptor{m.Config}, m.Layers...) {
		s.sizes[b.Digest] = b.Size
	}
	return d
}

// Give makes the server answer a GET of blob b in full, in any mode but StallAll: the pull stalls on another blob.
func (s *StallServer) Give(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.given[digest.FromBytes(b)] = b
}

// Requests delivers "METHOD path" of every request the server read, in order.
func (s *StallServer) Requests() <-chan string { return s.requests }

// Hangups delivers "METHOD path" of every stalled request whose client closed the connection.
func (s *StallServer) Hangups() <-chan string { return s.hangups }

// ExtraBytes counts the bytes clients sent on stalled connections after their request: none is expected.
func (s *StallServer) ExtraBytes() int64 { return s.extra.Load() }

func (s *StallServer) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		line := req.Method + " " + req.URL.Path
		send(s.requests, line)
		if s.answer(c, req) {
			continue
		}
		// Stalled: hold the connection, counting anything the client sends, until it hangs up.
		buf := make([]byte, 512)
		for {
			n, err := br.Read(buf)
			s.extra.Add(int64(n))
			if err != nil {
				send(s.hangups, line)
				return
			}
		}
	}
}

// answer writes the response to req unless the mode stalls it; false means stall.
func (s *StallServer) answer(c net.Conn, req *http.Request) bool {
	if s.Mode == StallAll {
		return false
	}
	p := req.URL.Path
	if p == "/v2/" || p == "/v2" {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nDocker-Distribution-Api-Version: registry/2.0\r\nContent-Length: 2\r\n\r\n{}")
		return true
	}
	ref := p[strings.LastIndex(p, "/")+1:]
	s.mu.Lock()
	m, isManifest := s.manifests[ref]
	size, isBlob := s.sizes[digest.Digest(ref)]
	given, isGiven := s.given[digest.Digest(ref)]
	s.mu.Unlock()
	switch {
	case strings.Contains(p, "/blobs/") && isGiven && req.Method == http.MethodGet:
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", len(given))
		c.Write(given)
		return true
	case strings.Contains(p, "/manifests/") && isManifest:
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nDocker-Content-Digest: %s\r\nContent-Length: %d\r\n\r\n",
			m.mediaType, digest.FromBytes(m.body), len(m.body))
		if req.Method != http.MethodGet {
			return true
		}
		if s.Mode == StallManifestBodies {
			return false
		}
		c.Write(m.body)
		return true
	case strings.Contains(p, "/blobs/") && isBlob && req.Method == http.MethodGet:
		if s.Mode == StallBlobBodies {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nDocker-Content-Digest: %s\r\nContent-Length: %d\r\n\r\n", ref, size)
		}
		return false
	default:
		fmt.Fprintf(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
		return true
	}
}

// send never blocks the server on a test that stopped listening.
func send(ch chan string, v string) {
	select {
	case ch <- v:
	default:
	}
}
