package main

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	humanize "github.com/dustin/go-humanize"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// run1 runs cmd with extra environment; its output goes to stderr, as a script's `>&2` (stdout stays the report).
func run1(cmd *exec.Cmd, extraEnv ...string) error {
	if len(extraEnv) > 0 {
		cmd.Env = append(os.Environ(), extraEnv...)
	}
	if cmd.Stdout == nil {
		cmd.Stdout = os.Stderr
	}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	}
	return nil
}

// timed runs cmd (as run1) and returns its wall seconds.
func timed(cmd *exec.Cmd, extraEnv ...string) (float64, error) {
	start := time.Now()
	err := run1(cmd, extraEnv...)
	return time.Since(start).Seconds(), err
}

// usage is what a finished command cost: CPU seconds (user+sys) and peak RSS in MiB.
func usage(cmd *exec.Cmd) (cpu float64, rssMiB int64) {
	st := cmd.ProcessState
	ru, _ := st.SysUsage().(*syscall.Rusage)
	if ru != nil {
		rssMiB = ru.Maxrss / 1024 // KiB on Linux
	}
	return (st.UserTime() + st.SystemTime()).Seconds(), rssMiB
}

// fresh removes paths and settles the disk: deleting gigabytes (and its discards) is part of no tool's time.
func fresh(paths ...string) {
	for _, p := range paths {
		os.RemoveAll(p)
	}
	syscall.Sync()
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// dirSize is the total size of the regular files under dir, humanised ("2.0 GiB").
func dirSize(dir string) (string, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		n += fi.Size()
		return err
	})
	return humanize.IBytes(uint64(n)), err
}

// modelFiles lists the model's files (relative, sorted as WalkDir does), leaving out the .complete mark.
func modelFiles(dir string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == ".complete" {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		files = append(files, rel)
		return nil
	})
	return files, err
}

// blobsOf is the plain HTTP registry's manifest of ref (host/repo:tag) and its blobs: the config, then the layers.
type blobsOf struct {
	host, repo string
	manifest   ocispec.Manifest
}

func (b blobsOf) all() []ocispec.Descriptor {
	return append([]ocispec.Descriptor{b.manifest.Config}, b.manifest.Layers...)
}

func (b blobsOf) bytes() int64 {
	var n int64
	for _, d := range b.all() {
		n += d.Size
	}
	return n
}

func manifestOf(ref string) (blobsOf, error) {
	host, rt, _ := strings.Cut(ref, "/")
	i := strings.LastIndex(rt, ":")
	b := blobsOf{host: host, repo: rt[:i]}
	req, _ := http.NewRequest(http.MethodGet, "http://"+host+"/v2/"+b.repo+"/manifests/"+rt[i+1:], nil)
	req.Header.Set("Accept", ocispec.MediaTypeImageManifest)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return b, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("manifest of %s: %s", ref, resp.Status)
	}
	return b, json.NewDecoder(resp.Body).Decode(&b.manifest)
}

// curlAll downloads every blob at once, one curl each (the peer: a plain parallel download that verifies nothing),
// into dir; with durable, then `sync FILE…` makes them durable before use.
func (b blobsOf) curlAll(dir string, durable bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	blobs := b.all()
	errs := make(chan error, len(blobs))
	var files []string
	for _, d := range blobs {
		f := filepath.Join(dir, d.Digest.String())
		files = append(files, f)
		cmd := exec.Command("curl", "-fsS", "-o", f, "http://"+b.host+"/v2/"+b.repo+"/blobs/"+d.Digest.String())
		go func() { errs <- run1(cmd) }()
	}
	var first error
	for range blobs {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil || !durable {
		return first
	}
	return run1(exec.Command("sync", files...))
}

// whole formats numbers without decimals, space-separated (MiB, bytes).
func whole(xs []float64) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf("%.0f", x)
	}
	return strings.Join(out, " ")
}

// envInt is the integer in the environment variable name, or def when unset.
func envInt(name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		fmt.Fprintf(os.Stderr, "bench: %s=%q: want a positive integer (default %d)\n", name, v, def)
		os.Exit(2)
	}
	return n
}
