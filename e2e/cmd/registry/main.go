// Command registry runs the registry the Go tests and benchmarks run (internal/testenv), for the shell scripts:
// storage under DIR, a free loopback port, host:port printed on stdout once it answers; SIGTERM or SIGINT stops
// it. So the demo configures no registry of its own.
//
//	registry DIR
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/modelpack/modelpack/internal/testenv"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: registry DIR")
		os.Exit(2)
	}
	if err := serve(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "registry:", err)
		os.Exit(1)
	}
}

func serve(dir string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	bin, err := exec.LookPath("registry")
	if err != nil {
		return fmt.Errorf("the registry binary is not on PATH (make tools builds it into bin/tools): %w", err)
	}
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := l.Addr().String()
	l.Close()
	r, err := testenv.LaunchRegistry(bin, dir, testenv.RegistryOptions{Dir: data, Addr: addr})
	if r != nil {
		defer r.Stop()
	}
	if err != nil {
		return err
	}
	fmt.Println(r.Host)
	<-ctx.Done()
	return nil
}
