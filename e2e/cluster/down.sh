#!/usr/bin/env bash
# Stops the local cluster and undoes everything up.sh did to the machine, also after a half-finished start:
# every process by PID (daemons from pids/, containerd shims and container processes by the PIDs they recorded
# and the kubelet's cgroups hold), every mount under the paths the cluster used, the kubelet's cgroups, the
# bridge link, the kubelet's iptables chains and sysctls, the shared mount of /var/lib/kubelet and the host
# paths it created. Then it checks that nothing is left and fails if something is. KEEP=1 keeps $RUN (logs).
set -uo pipefail
source "$(dirname "$0")/env.sh"
source "$(dirname "$0")/lib.sh"
[ -d "$RUN" ] || { echo "down: no cluster state in $RUN"; exit 0; }

# Let the kubelet unpublish volumes while everything still runs: a clean NodeUnpublish is the best teardown.
if [ -f "$RUN/pids/kubelet.pid" ] && alive "$(cat "$RUN/pids/kubelet.pid")" && [ -f "$KUBECONFIG" ]; then
  drain_pods
fi
for s in kubelet-registrar modelpack-csi kubelet kube-scheduler kube-controller-manager; do stop $s; done

# Container processes: those in the kubelet's cgroups, then the shims containerd started.
pod_pids() { cat /sys/fs/cgroup/*/kubepods/cgroup.procs /sys/fs/cgroup/*/kubepods/*/cgroup.procs \
  /sys/fs/cgroup/*/kubepods/*/*/cgroup.procs /sys/fs/cgroup/*/kubepods/*/*/*/cgroup.procs 2>/dev/null | sort -u; }
shim_pids() { find "$RUN/containerd/state" -name 'shim.pid' -exec cat {} + 2>/dev/null; }
for p in $(pod_pids); do kill -9 "$p" 2>/dev/null; done
stop containerd
for p in $(shim_pids); do kill -9 "$p" 2>/dev/null; done
for _ in $(seq 25); do [ -z "$(pod_pids)" ] && break; for p in $(pod_pids); do kill -9 "$p" 2>/dev/null; done; sleep 0.2; done
for s in registry kube-apiserver etcd; do stop $s; done
# The daemons held the cluster lock; take it now so no new cluster starts before this cleanup is done.
[ "$(readlink /proc/$$/fd/9 2>/dev/null)" = "$LOCK" ] || exec 9>>"$LOCK"
flock -w 60 9 || echo "down: $LOCK still held by a process not in $RUN/pids" >&2

# Mounts, deepest first: the kubelet's directory (pods' volumes, then its own shared bind), the state dir,
# the network namespaces containerd pinned.
for _ in 1 2 3; do  # a bind mounted on itself appears once per layer
  unmount_under "$KUBELET_DIR/"; unmount_under "$RUN/"; unmount_under /run/netns/cni-; unmount_under /run/containerd/
done
if [ -f "$RUN/shared-mount" ]; then
  while awk -v p="$KUBELET_DIR" '$2 == p' /proc/self/mounts | grep -q .; do umount "$KUBELET_DIR" 2>/dev/null || umount -l "$KUBELET_DIR" || break; done
  rm -f "$RUN/shared-mount"
fi
rm -f /run/netns/cni-* 2>/dev/null

# cgroups the kubelet made (cgroup v1: one tree per controller; v2: one), deepest first.
for base in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods.slice /sys/fs/cgroup/kubepods.slice; do
  [ -d "$base" ] && find "$base" -depth -type d -exec rmdir {} \; 2>/dev/null
done

ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
restore_sysctls
remove_kubelet_chains
remove_created_paths

# ---- nothing may be left ----
awk -v k="$KUBELET_DIR" -v r="$RUN/" 'index($2, k) == 1 || index($2, r) == 1 || index($2, "/run/netns/cni-") == 1 {print $2}' /proc/self/mounts |
  while read -r m; do echo "mount $m"; done > "$RUN/.leftover-mounts"
[ -s "$RUN/.leftover-mounts" ] && leftover "$(cat "$RUN/.leftover-mounts")"
[ -n "$(pod_pids)" ] && leftover "container processes $(pod_pids | tr '\n' ' ')"
for p in $(shim_pids); do alive "$p" && leftover "containerd shim pid $p"; done
ls -d /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods 2>/dev/null | grep -q . && leftover "cgroups $(ls -d /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods 2>/dev/null | tr '\n' ' ')"
ip link show "$BRIDGE" >/dev/null 2>&1 && leftover "link $BRIDGE"
check_host_state
finish_down
