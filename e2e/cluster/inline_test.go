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
	script := harness.SumScript(mnt) +
		"; grep ' " + mnt + " ' /proc/mounts" +
		"; if touch " + mnt + "/new 2>/tmp/err; then echo WRITE-OK; else cat /tmp/err; fi"
	c.Apply(t, c.PodManifest(harness.PodSpec{Name: "inline", Script: script,
		Volumes: []harness.Volume{{Name: "model", MountPath: mnt, CSI: map[string]string{"reference": ref}}}}))
	pod := c.WaitPhase(t, "default", "inline", corev1.PodSucceeded, podTimeout)
	log := c.Logs(t, "default", "inline", "")

	if got, want := harness.ParseSums(t, log, mnt), harness.TreeSums(t, src); !maps.Equal(got, want) {
		t.Errorf("the container read other bytes than the source:\ngot  %v\nwant %v", got, want)
	}
	var opts string
	for _, line := range strings.Split(log, "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[1] == mnt {
			opts = f[3]
		}
	}
	for _, o := range []string{"ro", "nosuid", "nodev"} {
		if !hasOpt(opts, o) {
			t.Errorf("mount %s in the container has options %q, missing %s", mnt, opts, o)
		}
	}
	if strings.Contains(log, "WRITE-OK") || !strings.Contains(log, "Read-only file system") {
		t.Errorf("a write into the volume did not fail with EROFS:\n%s", log)
	}

	// On the host, the kubelet's target for this volume is mounted while the pod exists, and gone after.
	target := harness.PodVolumeDir(string(pod.UID), "model")
	if _, ok := harness.HostMounts(t, target)[target]; !ok {
		t.Errorf("no host mount at %s while the pod exists", target)
	}
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
