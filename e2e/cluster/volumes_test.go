//go:build cluster

package cluster

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// runSeed makes this run's shards differ from any earlier run's on the same cluster, whose node cache keeps them.
var runSeed = uint64(time.Now().UnixNano()%(1<<30)) << 12

// genModel writes a small model whose shards are distinct per seed and per run, so no test finds another's shards
// in the node cache.
func genModel(t *testing.T, seed uint64, shards int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Generate(dir, testmodel.Spec{Shards: shards, ShardSize: 1 << 20, Seed: runSeed + seed*16}); err != nil {
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
	if err := testmodel.WriteShard(filepath.Join(b, testmodel.ShardName(3, 4)), 1<<20, runSeed+399*16); err != nil {
		t.Fatal(err)
	}
	refA, layersA := c.PushModel(t, a, "e2e/shared-a:v1")
	refB, layersB := c.PushModel(t, b, "e2e/shared-b:v1")
	// The shards: three shared, one each of their own. (The small files are the same in every test model, so
	// an earlier test may have cached them already.)
	shards := func(ref string) map[string]bool {
		repo, tag, _ := strings.Cut(strings.TrimPrefix(ref, c.Registry+"/"), "@")
		m, _ := c.Manifest(t, repo, tag)
		s := map[string]bool{}
		for _, l := range m.Layers {
			if strings.HasSuffix(l.Annotations["org.cncf.model.filepath"], ".safetensors") {
				s[l.Digest] = true
			}
		}
		return s
	}
	shardsA, shardsB := shards(refA), shards(refB)
	var shared []string
	for l := range shardsA {
		if shardsB[l] {
			shared = append(shared, l)
		}
	}
	if len(shardsA) != 4 || len(shardsB) != 4 || len(shared) != 3 {
		t.Fatalf("models have %d and %d shards, %d shared; want 4, 4, 3", len(shardsA), len(shardsB), len(shared))
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
	for _, l := range append(layersA, layersB...) {
		if gets[l] > 1 {
			t.Errorf("blob %s downloaded %d times onto one node", l, gets[l])
		}
	}
	for l := range shardsA {
		if gets[l] != 1 {
			t.Errorf("shard %s of the first model downloaded %d times, want once", l, gets[l])
		}
	}
	for l := range shardsB {
		if gets[l] != 1 {
			t.Errorf("shard %s of the second model downloaded %d times, want once", l, gets[l])
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
