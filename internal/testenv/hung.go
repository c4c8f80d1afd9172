package testenv

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// HungServer accepts TCP connections and never writes a byte: a registry whose machine is up and whose server is
// stuck, which a client only notices by timing out (a stopped registry refuses at once instead).
type HungServer struct {
	Host string // 127.0.0.1:port

	ln       net.Listener
	accepted atomic.Int64
	read     atomic.Int64
	mu       sync.Mutex
	conns    []net.Conn
}

// StartHungServer listens on a free loopback port until test end, when the listener and every accepted
// connection are closed and their goroutines have returned.
func StartHungServer(t testing.TB) *HungServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &HungServer{Host: ln.Addr().String(), ln: ln}
	var readers sync.WaitGroup
	accepting := make(chan struct{})
	go func() {
		defer close(accepting)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.accepted.Add(1)
			h.mu.Lock()
			h.conns = append(h.conns, c)
			h.mu.Unlock()
			readers.Add(1)
			go func() {
				defer readers.Done()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					h.read.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-accepting
		h.mu.Lock()
		for _, c := range h.conns {
			c.Close()
		}
		h.mu.Unlock()
		readers.Wait()
	})
	return h
}

// Accepted counts the connections accepted so far.
func (h *HungServer) Accepted() int64 { return h.accepted.Load() }

// BytesRead counts the bytes clients sent so far.
func (h *HungServer) BytesRead() int64 { return h.read.Load() }
