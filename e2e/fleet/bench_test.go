//go:build fleet

package fleet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/modelpack/modelpack/e2e/fleet/kraken"
	"github.com/modelpack/modelpack/internal/testenv"
)

// BenchmarkFleet is issue 33's fleet table: N simulated nodes (1, 3, 6: a `modelpack csi-driver` process each,
// with a root of its own and, with P2P, a Kraken agent of its own) publish one cold model at once, as N pods
// scheduled together, in three set-ups — straight to the registry, through a pull-through cache (distribution in
// proxy mode, every node's mirror) and through Kraken (each node's agent its mirror) — with the registry's link
// capped (tc htb on the registry's port, BENCH_FLEET_RATE, default 400mbit) so that, as in production, its bandwidth
// is the bottleneck, and uncapped. Per run: the registry's egress (blob bytes it served, counted by the proxy in
// front of it) over the model's size; the time until the last node has read the last byte of its mount; and the
// CPU-seconds per GiB mounted of each node's driver and agent (nginx included), averaged over nodes. All nodes
// share this machine's cores, so CPU time is the cost of a node's pull, not its speed.
//
//	BENCH_ONLY=fleet make bench    # or: go test -tags fleet -run '^$' -bench '^BenchmarkFleet$' -benchtime 1x ./e2e/fleet/
//
// BENCH_FLEET_SIZE sets the model size (default 256MiB in two shards; the 2 GiB model costs 12 GiB of writes per
// six-node run, on one disk), BENCH_FLEET_NODES the node counts (default 1,3,6).
func BenchmarkFleet(b *testing.B) {
	testenv.RequireRoot(b)
	size := benchSize(b)
	rate := os.Getenv("BENCH_FLEET_RATE")
	if rate == "" {
		rate = "400mbit"
	}
	counts := []int{1, 3, 6}
	if s := os.Getenv("BENCH_FLEET_NODES"); s != "" {
		counts = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				b.Fatalf("BENCH_FLEET_NODES=%q: want node counts such as 1,3,6", s)
			}
			counts = append(counts, n)
		}
	}
	o := startOrigin(b)
	files, weights := model(b, o, "models/bench", 2, size/2, 900)
	var rows []fleetRow
	for _, capped := range []bool{true, false} {
		link := "uncapped"
		if capped {
			link = rate
		}
		for _, n := range counts {
			for _, setup := range []string{"direct", "pull-through", "kraken"} {
				b.Run(fmt.Sprintf("%s/N=%d/%s", link, n, setup), func(b *testing.B) {
					if capped {
						capPort(b, o.reg.Host, rate)
					}
					dir := b.TempDir()
					testenv.NoMountsLeftUnder(b, dir)
					var agents []*kraken.Agent
					switch setup {
					case "pull-through":
						cache := testenv.StartRegistry(b, testenv.RegistryOptions{ProxyRemoteURL: "http://" + o.Host})
						for range n {
							agents = append(agents, &kraken.Agent{Registry: cache.Host})
						}
					case "kraken":
						agents = kraken.Start(b, o.Host, n).Agents
					}
					ns := startNodes(b, dir, o, n, agents, setup)
					before := o.bytes("", weights...)
					cpu0 := nodesCPU(ns, setup == "kraken")
					start := time.Now()
					targets, _ := publishAll(b, ns, "models/bench:v1", "pod")
					for i, target := range targets {
						mounted(b, ns[i].name, target, files) // reads every byte, compares it with what was pushed
					}
					took := time.Since(start)
					cpu := nodesCPU(ns, setup == "kraken") - cpu0
					rows = append(rows, fleetRow{link: link, n: n, setup: setup, took: took,
						copies:    copies(o.bytes("", weights...)-before, size),
						cpuPerGiB: cpu / float64(n) / (float64(size) / (1 << 30))})
				})
			}
		}
	}
	fmt.Printf("\nFLEET: %d MiB model (2 shards), N nodes cold at once, registry link %s or uncapped (%s)\n", size>>20, rate, time.Now().UTC().Format(time.RFC3339))
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "link\tN\tset-up\tregistry copies\tlast byte\tvs direct\tnode CPU-s/GiB\t")
	for _, r := range rows {
		ratio := "-"
		for _, d := range rows {
			if d.link == r.link && d.n == r.n && d.setup == "direct" && r.took > 0 {
				ratio = fmt.Sprintf("%.2fx", d.took.Seconds()/r.took.Seconds())
			}
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%.2f\t%s\t%s\t%.2f\t\n", r.link, r.n, r.setup, r.copies, r.took.Round(10*time.Millisecond), ratio, r.cpuPerGiB)
	}
	w.Flush()
	fmt.Println("(vs direct: the direct run's time over this one's, at the same N and link: above 1x is faster than straight to the registry)")
}

type fleetRow struct {
	link, setup string
	n           int
	took        time.Duration
	copies      float64
	cpuPerGiB   float64
}

func benchSize(b *testing.B) int64 {
	s := os.Getenv("BENCH_FLEET_SIZE")
	if s == "" {
		return 256 << 20
	}
	for suffix, shift := range map[string]uint{"GiB": 30, "MiB": 20} {
		if v, ok := strings.CutSuffix(s, suffix); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil && n > 0 {
				return n << shift
			}
		}
	}
	b.Fatalf("BENCH_FLEET_SIZE=%q: want a size such as 256MiB or 2GiB", s)
	return 0
}

// capPort shapes what the process listening on host:port sends over loopback to rate (tc htb; every other
// loopback flow goes through an unshaped class), until the benchmark ends. It refuses to replace a root qdisc
// someone else put on lo.
func capPort(b *testing.B, host, rate string) {
	b.Helper()
	_, port, _ := strings.Cut(host, ":")
	if out, _ := exec.Command("tc", "qdisc", "show", "dev", "lo").CombinedOutput(); !strings.Contains(string(out), "noqueue") {
		b.Fatalf("lo already has a queueing discipline, left as it is:\n%s", out)
	}
	tc := func(args ...string) {
		if out, err := exec.Command("tc", args...).CombinedOutput(); err != nil {
			exec.Command("tc", "qdisc", "del", "dev", "lo", "root").Run()
			b.Fatalf("tc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "20", "r2q", "100000")
	b.Cleanup(func() {
		if out, err := exec.Command("tc", "qdisc", "del", "dev", "lo", "root").CombinedOutput(); err != nil {
			b.Errorf("remove the link cap from lo: %v\n%s", err, out)
		}
	})
	tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb", "rate", "100gbit", "burst", "4mb")
	tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb", "rate", rate, "ceil", rate, "burst", "256kb", "cburst", "256kb")
	tc("filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip", "sport", port, "0xffff", "flowid", "1:10")
}

// nodesCPU is the CPU time, in seconds, the nodes' drivers (and, with agents, their Kraken agents and nginx) have
// used so far.
func nodesCPU(ns []*node, agents bool) float64 {
	var s float64
	for _, nd := range ns {
		s += procCPU(func(pid, pgid int) bool { return pid == nd.cmd.Process.Pid })
		if agents && nd.agent != nil && nd.agent.Proc != nil {
			g := nd.agent.Pgid()
			s += procCPU(func(_, pgid int) bool { return pgid == g })
		}
	}
	return s
}

// procCPU sums utime+stime of the live processes match selects by pid and process group.
func procCPU(match func(pid, pgid int) bool) float64 {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	for _, st := range stats {
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(st)))
		f := kraken.ProcStat(st)
		if len(f) < 13 {
			continue
		}
		pgid, _ := strconv.Atoi(f[2])
		if !match(pid, pgid) {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		k, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + k
	}
	return float64(ticks) / 100 // USER_HZ
}
