//go:build cluster

package cluster

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// genModel writes a small model (distinct per seed, so no test finds another's blobs in the node cache).
func genModel(t *testing.T, seed uint64, shards int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Generate(dir, testmodel.Spec{Shards: shards, ShardSize: 1 << 20, Seed: seed}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestStaticPersistentVolume: a PV naming a model, bound by kube-controller-manager to a claim, mounted by a pod.
func TestStaticPersistentVolume(t *testing.T) {
	c := harness.Connect(t)
	src := genModel(t, 201, 2)
	ref, _ := c.PushModel(t, src, "e2e/static:v1")
	c.Apply(t, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolume
metadata: {name: e2e-static}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadOnlyMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  claimRef: {namespace: default, name: e2e-static}
  csi:
    driver: modelpack.csi.dev
    volumeHandle: e2e-static
    readOnly: true
    volumeAttributes: {reference: "%s"}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: e2e-static, namespace: default}
spec:
  accessModes: [ReadOnlyMany]
  storageClassName: ""
  volumeName: e2e-static
  resources: {requests: {storage: 1Gi}}
`, ref))
	const mnt = "/models/static"
	c.Apply(t, c.PodManifest(harness.PodSpec{Name: "static", Script: harness.SumScript(mnt),
		Volumes: []harness.Volume{{Name: "model", MountPath: mnt, Claim: "e2e-static"}}}))
	c.WaitPhase(t, "default", "static", corev1.PodSucceeded, podTimeout)
	if phase := strings.TrimSpace(c.Kubectl(t, "get", "pvc", "e2e-static", "-o", "jsonpath={.status.phase}")); phase != "Bound" {
		t.Errorf("claim is %q, want Bound", phase)
	}
	if got, want := harness.ParseSums(t, c.Logs(t, "default", "static", ""), mnt), harness.TreeSums(t, src); !maps.Equal(got, want) {
		t.Errorf("the container read other bytes than the source:\ngot  %v\nwant %v", got, want)
	}
}

// TestSharedShards: two models that share three of four shards, mounted by two pods on the node: each shared
// blob is downloaded once.
func TestSharedShards(t *testing.T) {
	c := harness.Connect(t)
	a := genModel(t, 301, 4)
	b := filepath.Join(t.TempDir(), "model")
	if err := os.CopyFS(b, os.DirFS(a)); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteShard(filepath.Join(b, testmodel.ShardName(3, 4)), 1<<20, 399); err != nil {
		t.Fatal(err)
	}
	refA, layersA := c.PushModel(t, a, "e2e/shared-a:v1")
	refB, layersB := c.PushModel(t, b, "e2e/shared-b:v1")
	shared := map[string]bool{}
	inA := map[string]bool{}
	for _, l := range layersA {
		inA[l] = true
	}
	for _, l := range layersB {
		if inA[l] {
			shared[l] = true
		}
	}
	if len(shared) < 3 {
		t.Fatalf("models share %d layers, want at least the 3 shards", len(shared))
	}

	mark := c.Mark(t)
	const mnt = "/models/m"
	for name, ref := range map[string]string{"shared-a": refA, "shared-b": refB} {
		c.Apply(t, c.PodManifest(harness.PodSpec{Name: name, Script: harness.SumScript(mnt),
			Volumes: []harness.Volume{{Name: "model", MountPath: mnt, CSI: map[string]string{"reference": ref}}}}))
	}
	for name, src := range map[string]string{"shared-a": a, "shared-b": b} {
		c.WaitPhase(t, "default", name, corev1.PodSucceeded, podTimeout)
		if got, want := harness.ParseSums(t, c.Logs(t, "default", name, ""), mnt), harness.TreeSums(t, src); !maps.Equal(got, want) {
			t.Errorf("%s read other bytes than its source:\ngot  %v\nwant %v", name, got, want)
		}
	}
	gets := c.BlobGETs(t, mark)
	for l := range shared {
		if gets[l] != 1 {
			t.Errorf("shared blob %s downloaded %d times, want once", l, gets[l])
		}
	}
	for _, l := range append(layersA, layersB...) {
		if gets[l] == 0 {
			t.Errorf("blob %s never downloaded: the count is not seeing the registry", l)
		}
	}
}

// TestNativeImageVolumeAnchor records the baseline this project exists to beat: a native image volume of a
// container image works through containerd, and of a ModelPack artifact it mounts an empty directory without
// any error. If the second half starts failing, containerd learned to unpack model artifacts: update the README.
func TestNativeImageVolumeAnchor(t *testing.T) {
	c := harness.Connect(t)
	data := filepath.Join(t.TempDir(), "hello.txt")
	if err := os.WriteFile(data, []byte("hello from a container image layer\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := c.PushImage(t, "e2e/native-data:v1", data+"=/data/hello.txt")
	model, _ := c.PushModel(t, genModel(t, 401, 1), "e2e/native-model:v1")

	script := "echo '--- files'; find /m -type f | sort; echo '--- end'; cat /m/data/hello.txt 2>/dev/null; true"
	c.Apply(t, c.PodManifest(harness.PodSpec{Name: "native-image", Script: script,
		Volumes: []harness.Volume{{Name: "m", MountPath: "/m", Image: img}}}))
	c.Apply(t, c.PodManifest(harness.PodSpec{Name: "native-model", Script: script,
		Volumes: []harness.Volume{{Name: "m", MountPath: "/m", Image: model}}}))

	c.WaitPhase(t, "default", "native-image", corev1.PodSucceeded, podTimeout)
	if log := c.Logs(t, "default", "native-image", ""); !strings.Contains(log, "hello from a container image layer") {
		t.Errorf("native image volume of a container image: want the layer's file, got:\n%s", log)
	}
	c.WaitPhase(t, "default", "native-model", corev1.PodSucceeded, podTimeout)
	log := c.Logs(t, "default", "native-model", "")
	files := strings.TrimSpace(between(log, "--- files\n", "--- end"))
	if files != "" {
		t.Errorf("baseline changed: the native image volume of a ModelPack artifact now holds files:\n%s", files)
	}
	t.Logf("baseline: native image volume of ModelPack artifact %s → pod Succeeded, mounted directory empty", model)
}

func between(s, from, to string) string {
	_, rest, _ := strings.Cut(s, from)
	body, _, _ := strings.Cut(rest, to)
	return body
}
