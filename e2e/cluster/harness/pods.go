package harness

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// PodSpec describes a test pod: one busybox container on the node running Script with the volumes mounted
// read-only at their MountPath.
type PodSpec struct {
	Name, Namespace string
	Node            string // the node to run on; empty: the cluster's Node
	Script          string // run by /bin/sh -c
	Volumes         []Volume
	// RestartAlways keeps the pod running (a Script that loops); the default is restartPolicy Never.
	RestartAlways bool
	// Image and Command, when set, replace busybox and /bin/sh -c Script.
	Image   string
	Command []string
}

// Volume is one pod volume: exactly one of CSI, Image, Claim or ConfigMap.
type Volume struct {
	Name, MountPath string
	CSI             map[string]string // modelpack.csi.dev volumeAttributes
	SecretRef       string            // the CSI volume's nodePublishSecretRef, in the pod's namespace
	Image           string            // native image volume reference
	Claim           string            // PersistentVolumeClaim name
	ConfigMap       string            // ConfigMap name, its keys as files
}

// PodManifest renders spec as a Pod manifest for the cluster's node.
func (c *Cluster) PodManifest(spec PodSpec) string {
	ns := spec.Namespace
	if ns == "" {
		ns = "default"
	}
	node := spec.Node
	if node == "" {
		node = c.Node
	}
	restart := "Never"
	if spec.RestartAlways {
		restart = "Always"
	}
	var vols, mounts []map[string]any
	for _, v := range spec.Volumes {
		vol := map[string]any{"name": v.Name}
		switch {
		case v.CSI != nil:
			csi := map[string]any{"driver": "modelpack.csi.dev", "readOnly": true, "volumeAttributes": v.CSI}
			if v.SecretRef != "" {
				csi["nodePublishSecretRef"] = map[string]any{"name": v.SecretRef}
			}
			vol["csi"] = csi
		case v.Image != "":
			vol["image"] = map[string]any{"reference": v.Image, "pullPolicy": "IfNotPresent"}
		case v.Claim != "":
			vol["persistentVolumeClaim"] = map[string]any{"claimName": v.Claim, "readOnly": true}
		case v.ConfigMap != "":
			vol["configMap"] = map[string]any{"name": v.ConfigMap}
		}
		vols = append(vols, vol)
		mounts = append(mounts, map[string]any{"name": v.Name, "mountPath": v.MountPath, "readOnly": true})
	}
	image, command := c.Busybox, []string{"/bin/sh", "-c", spec.Script}
	if spec.Image != "" {
		image, command = spec.Image, spec.Command
	}
	pod := map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"name": spec.Name, "namespace": ns},
		"spec": map[string]any{
			"nodeName":                      node,
			"automountServiceAccountToken":  false,
			"restartPolicy":                 restart,
			"terminationGracePeriodSeconds": 1,
			"containers": []map[string]any{{
				"name":            "c",
				"image":           image,
				"imagePullPolicy": "IfNotPresent",
				"command":         command,
				"volumeMounts":    mounts,
			}},
			"volumes": vols,
		},
	}
	b, err := yaml.Marshal(pod)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// NotStarted reports whether a pod whose volume cannot be mounted is as kubelet leaves it: Pending, with no
// container status yet (kubelet may post the FailedMount event before it first writes one) or its one container
// waiting in ContainerCreating; never running.
func NotStarted(p *corev1.Pod) bool {
	cs := p.Status.ContainerStatuses
	return p.Status.Phase == corev1.PodPending && (len(cs) == 0 ||
		(len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "ContainerCreating"))
}

// HostMounts lists the host's mount points under prefix with their options.
func HostMounts(t testing.TB, prefix string) map[string]string {
	t.Helper()
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 4 && strings.HasPrefix(fields[1], prefix) {
			m[fields[1]] = fields[3]
		}
	}
	return m
}

// PodVolumeDir is where the kubelet mounts a pod's CSI volume on the host.
func PodVolumeDir(uid, volume string) string {
	return fmt.Sprintf("/var/lib/kubelet/pods/%s/volumes/kubernetes.io~csi/%s/mount", uid, volume)
}

// NodeLogs reads, from the node's files (/var/log/pods, CRI format), the logs of container in the pods of namespace
// whose names start with podPrefix, by pod name. Reading a file costs the node almost nothing, where `kubectl logs`
// starts a process and streams through the API server and the kubelet: a benchmark can poll it while it measures.
// A pod deleted but not yet cleaned up by the kubelet may still be listed.
func NodeLogs(t testing.TB, namespace, podPrefix, container string) map[string]string {
	t.Helper()
	return nodeLogsIn(t, "/var/log/pods", namespace, podPrefix, container)
}

func nodeLogsIn(t testing.TB, root, namespace, podPrefix, container string) map[string]string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(root, namespace+"_"+podPrefix+"*"))
	if err != nil {
		t.Fatal(err)
	}
	logs := map[string]string{}
	for _, dir := range dirs {
		pod := strings.TrimPrefix(filepath.Base(dir), namespace+"_")
		if i := strings.LastIndexByte(pod, '_'); i > 0 {
			pod = pod[:i] // the pod's UID follows its name
		}
		files, _ := filepath.Glob(filepath.Join(dir, container, "*.log"))
		var b strings.Builder
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				continue // rotated or removed since the glob
			}
			for _, line := range strings.SplitAfter(string(data), "\n") {
				// "<RFC 3339 time> <stream> <P|F> <text>"
				f := strings.SplitN(line, " ", 4)
				switch {
				case len(f) < 4:
				case f[2] == "P": // a partial line: its text goes on in the next record
					b.WriteString(strings.TrimSuffix(f[3], "\n"))
				default:
					b.WriteString(f[3])
				}
			}
		}
		logs[pod] = b.String()
	}
	return logs
}
