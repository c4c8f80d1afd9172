//go:build cluster

package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
)

// scenarios: what users hit besides one pod — four replicas of one model starting at once on a cold node, a pod
// whose model was prepulled, and the model already on the node under another tag.
func (b *bench) scenarios() {
	fmt.Println("\nscenarios (CSI volume; page cache dropped before each)")
	b.fleet()
	b.prepulled()
	b.otherTag()
}

// fleet: a Deployment of 4 replicas on the one node, node cache empty: one download, every pod as fast as one.
func (b *bench) fleet() {
	t, c := b.t, b.c
	b.resetDriver()
	dropCaches(t)
	mark := c.Mark(t)
	b.n++
	name := fmt.Sprintf("bench-fleet-%d", b.n)
	manifest := b.pod(name, "csi", true)
	t0, up0 := time.Now(), uptime(t)
	if _, err := c.RunInput(manifest, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	deleteFleet := func() {
		c.Run("delete", "deployment", name, "--ignore-not-found", "--wait=true", "--timeout=120s")
		c.Run("wait", "--for=delete", "pod", "-l", "app="+name, "--timeout=120s")
	}
	t.Cleanup(deleteFleet)
	done := map[string]float64{}
	waitFor(t, "4 replicas to read their model", podTimeout, func() bool {
		out, err := c.Run("get", "pods", "-l", "app="+name, "-o", "jsonpath={.items[*].metadata.name}")
		if err != nil {
			return false
		}
		for _, p := range strings.Fields(out) {
			if _, ok := done[p]; ok {
				continue
			}
			if log, err := c.Run("logs", p, "-c", "c"); err == nil && strings.Contains(log, "done ") {
				_, d := clockMarks(t, log)
				done[p] = d - up0
			}
		}
		return len(done) >= 4
	})
	slowest, fastest := 0.0, 1e9
	for _, d := range done {
		slowest, fastest = max(slowest, d), min(fastest, d)
	}
	gets := c.BlobGETs(t, mark)
	fmt.Printf("  4 replicas at once, cold node: pods done at %.2f–%.2f s; slowest = %.2fx one cold pod (%.2f s; target ≤ 1.1x); %s\n",
		fastest, slowest, slowest/b.coldCSI, b.coldCSI, getsPerBlob(b, gets, 1))
	var published []string
	for _, r := range b.driverRecords(t0) {
		if r.Phase == "call" && r.Method == "NodePublishVolume" && r.Code == "OK" {
			published = append(published, fmt.Sprintf("%.2f", r.end().Sub(t0).Seconds()))
		}
	}
	fmt.Printf("    their NodePublish calls answered OK at %s s\n", strings.Join(published, ", "))
	deleteFleet()
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
	mark := c.Mark(t)
	r := b.measure("csi")
	fmt.Printf("  prepulled model (ConfigMap → ready in %.1f s, incl. the kubelet's ConfigMap sync): pod %.2f s = %.2fx warm (%.2f s); %s\n",
		prepull, r.last, r.last/b.warmCSI, b.warmCSI, getsPerBlob(b, c.BlobGETs(t, mark), 0))
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
