package remote

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
)

// The guard lets through the source's own host:port, and the same socket under another name (localhost for
// 127.0.0.1: the Hub's download host in tests); any other loopback socket, however named, is refused before a
// byte is sent.
func TestGuardDialAllowsOnlyTheSourcesOwnSocket(t *testing.T) {
	listen := func() (string, func() int) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		accepted := make(chan struct{}, 16)
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				accepted <- struct{}{}
				c.Close()
			}
		}()
		return l.Addr().String(), func() int { return len(accepted) }
	}
	self, _ := listen()
	other, otherAccepted := listen()
	_, selfPort, _ := net.SplitHostPort(self)
	_, otherPort, _ := net.SplitHostPort(other)
	dial := GuardDial(&net.Dialer{}, "http", self, "Hub")
	ctx := context.Background()
	for _, addr := range []string{self, "localhost:" + selfPort} {
		c, err := dial(ctx, "tcp", addr)
		if err != nil {
			t.Errorf("dial %s, the source's own socket: %v", addr, err)
			continue
		}
		c.Close()
	}
	for _, addr := range []string{other, "localhost:" + otherPort, "169.254.169.254:80", "0.0.0.0:" + otherPort} {
		_, err := dial(ctx, "tcp", addr)
		if !errors.Is(err, ErrRedirectRefused) || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "is not that Hub") {
			t.Errorf("dial %s: %v", addr, err)
		}
	}
	if n := otherAccepted(); n != 0 {
		t.Errorf("the other socket accepted %d connections", n)
	}
}
