//go:build cluster

package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
	stats "github.com/modelpack/modelpack/internal/bench"
)

// scenarios: what users hit besides one pod — four replicas of one model starting at once on a cold node, a pod
// whose model was prepulled, and the model already on the node under another tag.
func (b *bench) scenarios(parts map[string]bool) {
	fmt.Println("\nscenarios (CSI volume; page cache dropped before each)")
	if parts["fleet"] {
		b.fleet()
	}
	if (parts["prepulled"] || parts["othertag"]) && b.warmCSI == 0 {
		// Without the table: a warm pod's time to compare with (the first pod pulls the model).
		b.measure("csi")
		b.warmCSI = b.measure("csi").last
		fmt.Printf("  warm CSI pod (without the table): %.2f s\n", b.warmCSI)
	}
	if parts["prepulled"] {
		b.prepulled()
	}
	if parts["othertag"] {
		b.otherTag()
	}
}

// fleet: Deployments of one replica and of four, in rotated order, BENCH_FLEET_RUNS (5) of each: on a cold node
// (cache emptied, page cache dropped), where the four share one download and the slowest should read its last byte
// within 1.1× of the single replica's time; then the same again on the warm node (the model on disk, page cache
// dropped), where no download is shared and the ratio is Kubernetes' own cost of starting four pods at once. Both
// go through the Deployment and ReplicaSet controllers, so the ratios are the node's (driver, kubelet, runtime),
// not the controllers'; one bare pod's time is printed beside.
func (b *bench) fleet() {
	runs := envInt(b.t, "BENCH_FLEET_RUNS", 5)
	slowest, afterMount, flushLead := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	answered := map[string][]float64{}
	last := map[string]*fleetRun{}
	for i := range runs {
		for _, n := range stats.Rotated([]int{1, 4}, i) {
			for _, cold := range []bool{true, false} {
				key := fmt.Sprintf("%s/%d", map[bool]string{true: "cold", false: "warm"}[cold], n)
				r := b.deployment(n, cold)
				slowest[key] = append(slowest[key], r.slowest())
				answered[key] = append(answered[key], stats.Max(r.published))
				afterMount[key] = append(afterMount[key], r.slowest()-stats.Max(r.published))
				if cold {
					flushLead[key] = append(flushLead[key], r.slowest()-r.flush[0])
				}
				last[key] = r
				fmt.Fprintf(os.Stderr, "fleet %d: %s %6.2f s (kubectl apply at uptime %.2f s)\n", i+1, key, r.slowest(), r.up0)
			}
		}
	}
	m := func(xs map[string][]float64, k string) float64 { return stats.Median(xs[k]) }
	for _, state := range []string{"cold", "warm"} {
		one, four := state+"/1", state+"/4"
		target := " (target ≤ 1.1x)"
		if state == "warm" {
			target = " (no download: Kubernetes starting the pods)"
		}
		fmt.Printf("  Deployment on a %s node, kubectl apply → the slowest replica's last byte (median of %d): 1 replica %.2f s, 4 replicas %.2f s = %.2fx%s\n",
			state, runs, m(slowest, one), m(slowest, four), m(slowest, four)/m(slowest, one), target)
		fmt.Printf("    runs: 1 replica %s, 4 replicas %s; from the last NodePublish answered to the slowest last byte: %.2f s and %.2f s; 4 replicas: %s\n",
			stats.Runs(slowest[one]), stats.Runs(slowest[four]), m(afterMount, one), m(afterMount, four), last[four].gets)
		if state == "cold" {
			// The download's share apart from the pods' starts: one pull serves both sizes, so a later answer
			// for four is the pull taking longer that run.
			fmt.Printf("    the last NodePublish answered at (s after kubectl apply): 1 replica %s, 4 replicas %s\n",
				stats.Runs(answered[one]), stats.Runs(answered[four]))
			fmt.Printf("    the background flush of the blobs began before the slowest replica's last byte by (s; < 0: after it): 1 replica %s, 4 replicas %s\n",
				stats.Runs(flushLead[one]), stats.Runs(flushLead[four]))
		}
	}
	if b.coldCSI > 0 {
		fmt.Printf("    one bare pod, cold: %.2f s\n", b.coldCSI)
	}
	for _, k := range []string{"cold/1", "cold/4"} {
		fmt.Printf("    last run, %s:", k)
		last[k].print()
	}
}

// A fleetRun is one Deployment's start: when each of its pods got where, in seconds after `kubectl apply`.
type fleetRun struct {
	pods      []fleetPod
	firstCall float64    // the driver's first NodePublish call began
	published []float64  // the driver's NodePublish calls answered OK
	flush     [2]float64 // the background flush of the pulled blobs began and ended (cold)
	gets      string
	up0       float64 // the node's uptime at kubectl apply, to line the run up with other records of the node
}

type fleetPod struct {
	name                                        string
	added, setUp, asked, running, started, done float64
}

func (r *fleetRun) slowest() float64 {
	s := 0.0
	for _, p := range r.pods {
		s = max(s, p.done)
	}
	return s
}

func (r *fleetRun) print() {
	fmt.Printf(" NodePublish answered OK at %s s", strings.Join(secs(r.published), ", "))
	if r.flush[1] > 0 {
		fmt.Printf("; the background flush of the blobs ran %.2f → %.2f s", r.flush[0], r.flush[1])
	}
	fmt.Printf("; per pod, seconds after kubectl apply:\n")
	fmt.Printf("    %-40s %7s %8s %8s %8s %8s %9s\n", "pod", "added", "set up", "sandbox", "running", "started", "last byte")
	for _, p := range r.pods {
		fmt.Printf("    %-40s %7.2f %8.2f %8.2f %8.2f %8.2f %9.2f\n", p.name, p.added, p.setUp, p.asked, p.running, p.started, p.done)
	}
}

// deployment starts a Deployment of replicas pods, on a cold node (the driver's cache emptied) or on a node that has
// the model, and returns when each got where.
func (b *bench) deployment(replicas int, cold bool) *fleetRun {
	t, c := b.t, b.c
	if cold {
		b.resetDriver()
	}
	dropCaches(t)
	mark := c.Mark(t)
	b.n++
	name := fmt.Sprintf("bench-fleet-%d", b.n)
	manifest := b.pod(name, "csi", replicas)
	t0, up0 := time.Now(), uptime(t)
	if _, err := c.RunInput(manifest, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	deleteFleet := func() {
		c.Run("delete", "deployment", name, "--ignore-not-found", "--wait=true", "--timeout=120s")
		c.Run("wait", "--for=delete", "pod", "-l", "app="+name, "--timeout=120s")
	}
	t.Cleanup(deleteFleet)
	marks := readMarks(t, name+"-", replicas, up0)
	gets := 0
	if cold {
		gets = 1
	}
	r := &fleetRun{gets: getsPerBlob(b, c.BlobGETs(t, mark), gets), up0: up0}
	since := func(at time.Time) float64 {
		if at.IsZero() {
			return 0
		}
		return at.Sub(t0).Seconds()
	}
	for p, m := range marks {
		k := b.kubeletTimes(t0, p)
		asked, running := b.sandboxTimes(t0, p)
		r.pods = append(r.pods, fleetPod{name: p, added: since(k["add"]), setUp: since(k["setup"]), asked: since(asked),
			running: since(running), started: m[0], done: m[1]})
	}
	sort.Slice(r.pods, func(i, j int) bool { return r.pods[i].done < r.pods[j].done })
	if cold {
		r.flush[0], r.flush[1] = b.flushWindow(t0)
	}
	for _, rec := range b.driverRecords(t0) {
		if rec.Phase != "call" || rec.Method != "NodePublishVolume" {
			continue
		}
		if at := since(rec.Start); r.firstCall == 0 || at < r.firstCall {
			r.firstCall = at
		}
		if rec.Code == "OK" {
			r.published = append(r.published, since(rec.end()))
		}
	}
	deleteFleet()
	return r
}

func secs(xs []float64) []string {
	var out []string
	for _, x := range xs {
		out = append(out, fmt.Sprintf("%.2f", x))
	}
	return out
}

// prepulled: the model listed in the prepull ConfigMap, pulled by the prepull DaemonSet before any pod asks;
// the pod then starts as a warm one does, with no blob GET.
func (b *bench) prepulled() {
	t, c := b.t, b.c
	b.resetDriver()
	old := c.Kubectl(t, "-n", harness.Namespace, "get", "configmap", "modelpack-prepull", "-o", "jsonpath={.data.models\\.yaml}")
	set := func(list string) error {
		cm := fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: modelpack-prepull, namespace: %s}\ndata:\n  models.yaml: |\n    %s\n",
			harness.Namespace, strings.ReplaceAll(strings.TrimRight(list, "\n"), "\n", "\n    "))
		_, err := c.RunInput(cm, "apply", "-f", "-")
		return err
	}
	if err := set("models:\n- " + b.modelRef); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := set(old); err != nil {
			t.Errorf("restore the prepull ConfigMap: %v", err)
		}
	})
	ready := fmt.Sprintf(`"msg":"prepull ready","ref":%q`, b.modelRef)
	start := time.Now()
	waitFor(t, "the prepull DaemonSet to pull the model", podTimeout, func() bool {
		log, _ := c.Run("-n", harness.Namespace, "logs", "-l", "app.kubernetes.io/component=prepull", "--tail=-1")
		return strings.Contains(log, ready)
	})
	prepull := time.Since(start).Seconds()
	// Prepulled is pulled ahead of the pod, written back too: the background flush of the 2 GiB just pulled
	// (seconds here) would otherwise compete with the pod's read, which a warm pod never meets. The flush begins
	// only a while after the pull, so "no flush running" right after it would say nothing: its record is awaited.
	_, ended := b.flushWindow(start)
	flush := max(0, ended-prepull)
	mark := c.Mark(t)
	r := b.measure("csi")
	fmt.Printf("  prepulled model (ConfigMap → ready in %.1f s, incl. the kubelet's ConfigMap sync; its flush done %.1f s later): pod %.2f s = %.2fx warm (%.2f s); %s\n",
		prepull, flush, r.last, r.last/b.warmCSI, b.warmCSI, getsPerBlob(b, c.BlobGETs(t, mark), 0))
}

// otherTag: the same manifest pushed under another tag, while the node holds it: the pod naming the new tag
// resolves it (one manifest request) and downloads nothing.
func (b *bench) otherTag() {
	t, c := b.t, b.c
	const accept = "application/vnd.oci.image.manifest.v1+json"
	base := "http://" + c.Registry + "/v2/" + b.repo + "/manifests/"
	req, _ := http.NewRequest(http.MethodGet, base+"v1", nil)
	req.Header.Set("Accept", accept)
	manifest := httpDo(t, req)
	req, _ = http.NewRequest(http.MethodPut, base+"other", bytes.NewReader(manifest))
	req.Header.Set("Content-Type", accept)
	httpDo(t, req)
	mark := c.Mark(t)
	r := b.measure("csi:" + c.Registry + "/" + b.repo + ":other")
	fmt.Printf("  cached under another tag (%s:v1 on the node, pod names :other): pod %.2f s = %.2fx warm; %s\n",
		b.repo, r.last, r.last/b.warmCSI, getsPerBlob(b, c.BlobGETs(t, mark), 0))
}

// getsPerBlob summarises the registry's blob GETs of the model's layers against the number each should have.
func getsPerBlob(b *bench, gets map[string]int, want int) string {
	lo, hi := int(^uint(0)>>1), 0
	for _, l := range b.layers {
		dgst, _, _ := strings.Cut(l, "=")
		lo, hi = min(lo, gets[dgst]), max(hi, gets[dgst])
	}
	verdict := "as wanted"
	if lo != want || hi != want {
		verdict = fmt.Sprintf("WANT %d", want)
		fmt.Fprintf(os.Stderr, "bench: blob GETs %v, want %d per layer\n", gets, want)
	}
	return fmt.Sprintf("blob GETs per layer %d–%d (%s)", lo, hi, verdict)
}

func httpDo(t *tb, req *http.Request) []byte {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s %s: %s\n%s", req.Method, req.URL, resp.Status, body)
	}
	return body
}
