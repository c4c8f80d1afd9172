// Command csiclient plays kubelet's side of CSI over a unix socket, for the e2e scripts and benchmarks.
//
//	csiclient -endpoint unix:///tmp/csi.sock publish -target DIR -attr reference=REF [-attr k=v…] [-timeout 2m]
//	csiclient -endpoint … unpublish -target DIR
//	csiclient -endpoint … bench -attr reference=REF -dir DIR -n 200   # warm publish latency, JSON p50/p99 in ms
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/modelpack/modelpack/internal/testenv"
)

type attrs map[string]string

func (a attrs) String() string { return fmt.Sprint(map[string]string(a)) }
func (a attrs) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("want key=value, got %q", s)
	}
	a[k] = v
	return nil
}

func main() {
	endpoint := flag.String("endpoint", "unix:///csi/csi.sock", "CSI endpoint")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: csiclient [-endpoint E] publish|unpublish|bench [flags]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() < 1 {
		flag.Usage()
		os.Exit(2)
	}
	conn, err := grpc.NewClient(*endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail(err)
	}
	defer conn.Close()
	node := csi.NewNodeClient(conn)

	sub := flag.NewFlagSet(flag.Arg(0), flag.ExitOnError)
	a := attrs{}
	sub.Var(a, "attr", "volume attribute key=value (repeatable)")
	target := sub.String("target", "", "target path")
	volID := sub.String("volume-id", "csiclient-vol", "volume id")
	timeout := sub.Duration("timeout", 2*time.Minute, "RPC deadline (kubelet uses about 2 minutes)")
	secret := sub.String("secret-file", "", "docker config.json sent as the nodePublishSecretRef")
	dir := sub.String("dir", "", "bench: directory for targets")
	n := sub.Int("n", 100, "bench: publishes to time")
	samples := sub.Bool("samples", false, "bench: also print each publish's start (Unix ms) and duration (ms)")
	sub.Parse(flag.Args()[1:])

	switch flag.Arg(0) {
	case "publish":
		req := publishRequest(*volID, *target, a)
		if *secret != "" {
			b, err := os.ReadFile(*secret)
			if err != nil {
				fail(err)
			}
			req.Secrets = map[string]string{".dockerconfigjson": string(b)}
		}
		// Retry ABORTED like kubelet does, so a pull longer than the deadline still ends in a mount.
		for {
			ctx, cancel := context.WithTimeout(context.Background(), *timeout)
			_, err := node.NodePublishVolume(ctx, req)
			cancel()
			if err == nil {
				return
			}
			if s := status.Convert(err); s.Code() == codes.Aborted {
				fmt.Fprintln(os.Stderr, "retrying:", s.Message())
				time.Sleep(100 * time.Millisecond)
				continue
			}
			fail(err)
		}
	case "unpublish":
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		defer cancel()
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: *volID, TargetPath: *target}); err != nil {
			fail(err)
		}
	case "bench":
		bench(node, a, *dir, *n, *timeout, *samples)
	default:
		flag.Usage()
		os.Exit(2)
	}
}

// bench times n publishes of content already on the node, each to a new target as for a new pod, and unpublishes
// them after timing. With samples it prints every publish, for the caller to pick those that overlapped something.
func bench(node csi.NodeClient, a attrs, dir string, n int, timeout time.Duration, samples bool) {
	if dir == "" {
		fail(fmt.Errorf("bench needs -dir"))
	}
	var ms []float64
	var each [][2]float64 // start (Unix ms), duration (ms)
	for i := range n {
		parent := filepath.Join(dir, fmt.Sprintf("pod-%d", i))
		if err := os.MkdirAll(parent, 0o755); err != nil {
			fail(err)
		}
		target := filepath.Join(parent, "mount")
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		start := time.Now()
		_, err := node.NodePublishVolume(ctx, publishRequest(fmt.Sprintf("bench-%d", i), target, a))
		el := time.Since(start)
		cancel()
		if err != nil {
			fail(err)
		}
		ms = append(ms, float64(el.Microseconds())/1000)
		each = append(each, [2]float64{float64(start.UnixMicro()) / 1000, ms[len(ms)-1]})
		ctx, cancel = context.WithTimeout(context.Background(), timeout)
		_, err = node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: fmt.Sprintf("bench-%d", i), TargetPath: target})
		cancel()
		if err != nil {
			fail(err)
		}
		os.Remove(parent)
	}
	slices.Sort(ms)
	pct := func(p float64) float64 { return ms[min(len(ms)-1, int(p*float64(len(ms))))] }
	out := map[string]any{"n": n, "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": ms[len(ms)-1]}
	if samples {
		out["samples"] = each
	}
	json.NewEncoder(os.Stdout).Encode(out)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "csiclient:", err)
	os.Exit(1)
}

// publishRequest is kubelet's request for a pod whose volume says readOnly: true.
func publishRequest(volID, target string, a attrs) *csi.NodePublishVolumeRequest {
	req := testenv.PublishRequest(volID, target, a)
	req.Readonly = true
	return req
}
