#!/usr/bin/env bash
# Stops the multi-node local cluster and undoes everything up.sh did, also after a half-finished start: the
# daemons by the PIDs up.sh recorded, container processes by the PIDs the nodes' cgroups hold, shims by the PIDs
# containerd recorded, and then any process still inside a node's mount or network namespace (by PID, found
# through /proc/PID/ns); every mount inside each node's namespace, the namespaces themselves (with their veths),
# the bridge, the kubelets' cgroup roots, the sysctls the kubelets rewrote, iptables chains, the host mount points
# it created. Then it checks that nothing is left and fails if something is. KEEP=1 keeps $RUN (logs).
set -uo pipefail
source "$(dirname "$0")/env.sh"
source "$ROOT/e2e/cluster/lib.sh"
[ -d "$RUN" ] || { echo "down: no fleet cluster state in $RUN"; exit 0; }

nodes=$(cd "$RUN/nodes" 2>/dev/null && ls)
if [ -f "$RUN/pids/kube-apiserver.pid" ] && alive "$(cat "$RUN/pids/kube-apiserver.pid")" && [ -f "$KUBECONFIG" ]; then
  drain_pods
fi
for n in $nodes; do stop "kubelet-$n"; done

# pod_pids: container processes, from the cgroup roots the kubelets used.
pod_pids() { cat /sys/fs/cgroup/*/mpfleet-*/cgroup.procs /sys/fs/cgroup/*/mpfleet-*/*/cgroup.procs /sys/fs/cgroup/*/mpfleet-*/*/*/cgroup.procs \
  /sys/fs/cgroup/*/mpfleet-*/*/*/*/cgroup.procs /sys/fs/cgroup/*/mpfleet-*/*/*/*/*/cgroup.procs 2>/dev/null | sort -u; }
shim_pids() { find "$RUN/nodes" -name 'shim.pid' -exec cat {} + 2>/dev/null; }
# ns_pids: every process inside one of the nodes' mount or network namespaces (by the ids up.sh recorded).
ns_pids() {
  local ids p
  ids=$(cat "$RUN"/nodes/*/mntns "$RUN"/nodes/*/netns 2>/dev/null | sort -u)
  [ -n "$ids" ] || return 0
  for p in /proc/[0-9]*; do
    { readlink "$p/ns/mnt"; readlink "$p/ns/net"; } 2>/dev/null | grep -qxF "$ids" && echo "${p#/proc/}"
  done
}
for p in $(pod_pids); do kill -9 "$p" 2>/dev/null; done
for n in $nodes; do stop "containerd-$n"; done
for p in $(shim_pids); do kill -9 "$p" 2>/dev/null; done
for _ in $(seq 25); do
  left_pids="$(pod_pids) $(ns_pids)"
  [ -z "${left_pids// /}" ] && break
  for p in $left_pids; do kill -9 "$p" 2>/dev/null; done
  sleep 0.2
done
for s in registry kube-scheduler kube-controller-manager kube-apiserver etcd; do stop $s; done
# The daemons held the cluster lock; take it now so no new cluster starts before this cleanup is done.
[ "$(readlink /proc/$$/fd/9 2>/dev/null)" = "$LOCK" ] || exec 9>>"$LOCK"
flock -w 60 9 || echo "down: $LOCK still held by a process not in $RUN/pids" >&2

# Mounts: inside each node's namespace first (pods' volumes, container roots, pod network namespaces, the binds),
# so nothing is left even if a process outside still held the namespace; then the namespace itself.
for n in $nodes; do
  if awk -v p="$RUN/ns/$n" '$2 == p' /proc/self/mounts | grep -q .; then
    nsenter --mount="$RUN/ns/$n" -- bash -c "source '$ROOT/e2e/cluster/lib.sh'
      for _ in 1 2 3; do for b in $NODE_BINDS; do unmount_under \"\${b#*=}/\"; done; done
      for b in $NODE_BINDS; do umount \"\${b#*=}\" 2>/dev/null || umount -l \"\${b#*=}\" 2>/dev/null; done" 2>/dev/null
    umount "$RUN/ns/$n" 2>/dev/null || umount -l "$RUN/ns/$n"
  fi
  ip netns list | grep -qw "^$n" && ip netns del "$n"
done
while awk -v p="$RUN/ns" '$2 == p' /proc/self/mounts | grep -q .; do umount "$RUN/ns" 2>/dev/null || umount -l "$RUN/ns" || break; done
ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"

# The kubelets' cgroup roots, deepest first.
for base in /sys/fs/cgroup/*/mpfleet-*; do
  [ -d "$base" ] && find "$base" -depth -type d -exec rmdir {} \; 2>/dev/null
done
restore_sysctls
remove_kubelet_chains
remove_created_paths

# ---- nothing may be left ----
awk -v r="$RUN/" 'index($2, r) == 1 || index($1, r) == 1 {print $2}' /proc/self/mounts | while read -r m; do echo "mount $m"; done > "$RUN/.leftover-mounts"
[ -s "$RUN/.leftover-mounts" ] && leftover "$(cat "$RUN/.leftover-mounts")"
[ -n "$(pod_pids)" ] && leftover "container processes $(pod_pids | tr '\n' ' ')"
[ -n "$(ns_pids)" ] && leftover "processes in the nodes' namespaces $(ns_pids | tr '\n' ' ')"
for p in $(shim_pids); do alive "$p" && leftover "containerd shim pid $p"; done
ls -d /sys/fs/cgroup/*/mpfleet-* 2>/dev/null | grep -q . && leftover "cgroups $(ls -d /sys/fs/cgroup/*/mpfleet-* | tr '\n' ' ')"
ip link show "$BRIDGE" >/dev/null 2>&1 && leftover "link $BRIDGE"
for n in $nodes; do
  ip netns list | grep -qw "^$n" && leftover "network namespace $n"
  ip link show "${n}h" >/dev/null 2>&1 && leftover "link ${n}h"
done
check_host_state
finish_down
