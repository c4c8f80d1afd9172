//go:build cluster

// Package cluster is the real-cluster suite: every test is a real pod on a real kubelet (containerd 2.x, runc)
// with modelpack deployed from deploy/overlays/local-cluster, asserting what the container read.
// Run it with `make e2e-cluster`; see README.md beside this file.
package cluster

import (
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
	"github.com/modelpack/modelpack/internal/testmodel"
)

const podTimeout = 3 * time.Minute

// TestInlineVolume: a pod with a CSI inline volume reads exactly the source files, through a read-only,
// nosuid, nodev mount that refuses writes with EROFS; deleting the pod unpublishes and leaves no mount.
func TestInlineVolume(t *testing.T) {
	c := harness.Connect(t)
	src := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Generate(src, testmodel.Spec{Shards: 3, ShardSize: 3 << 20, Seed: 101, Files: 3}); err != nil {
		t.Fatal(err)
	}
	ref, _ := c.PushModel(t, src, "e2e/inline:v1")

	const mnt = "/models/m"
	// The container checks, then stays up so the host side can be checked while the volume is in use.
	script := harness.SumScript(mnt) +
		"; grep ' " + mnt + " ' /proc/mounts" +
		"; touch " + mnt + "/new 2>&1 && echo WRITE-OK; echo CHECKED; exec sleep 3600"
	c.Apply(t, c.PodManifest(harness.PodSpec{Name: "inline", Script: script,
		Volumes: []harness.Volume{{Name: "model", MountPath: mnt, CSI: map[string]string{"reference": ref}}}}))
	pod := c.WaitPhase(t, "default", "inline", corev1.PodRunning, podTimeout)
	log := c.WaitLog(t, "default", "inline", "CHECKED", podTimeout)

	if got, want := harness.ParseSums(t, log, mnt), harness.TreeSums(t, src); !maps.Equal(got, want) {
		t.Errorf("the container read other bytes than the source:\ngot  %v\nwant %v", got, want)
	}
	if strings.Contains(log, "WRITE-OK") || !strings.Contains(log, "Read-only file system") {
		t.Errorf("a write into the volume did not fail with EROFS:\n%s", log)
	}
	var inPod string
	for _, line := range strings.Split(log, "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[1] == mnt {
			inPod = f[3]
		}
	}
	if !hasOpt(inPod, "ro") {
		t.Errorf("the volume in the container is mounted %q, not ro", inPod)
	}
	// What the driver publishes — the kubelet's target — must be ro,nosuid,nodev. The container's own bind of it
	// is made by the runtime: runc 1.1 (Debian 12) remounts it with ro only, runc ≥ 1.2 keeps nosuid,nodev.
	target := harness.PodVolumeDir(string(pod.UID), "model")
	onHost, ok := harness.HostMounts(t, target)[target]
	if !ok {
		t.Fatalf("no host mount at %s while the pod runs", target)
	}
	for _, o := range []string{"ro", "nosuid", "nodev"} {
		if !hasOpt(onHost, o) {
			t.Errorf("the published volume %s has options %q, missing %s", target, onHost, o)
		}
	}
	t.Logf("published %s: %s; in the container: %s", target, onHost, inPod)

	c.Kubectl(t, "delete", "pod", "inline", "--wait=true", "--timeout=120s")
	waitNoMounts(t, "/var/lib/kubelet/pods/"+string(pod.UID)+"/")
}

func hasOpt(opts, want string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}

// waitNoMounts waits until nothing is mounted under prefix on the host: the kubelet removes a deleted pod's
// volumes shortly after the API object is gone.
func waitNoMounts(t *testing.T, prefix string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		m := harness.HostMounts(t, prefix)
		if len(m) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still mounted after the pod was deleted: %v", m)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
