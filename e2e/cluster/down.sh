#!/usr/bin/env bash
# Stops the local cluster and undoes everything up.sh did to the machine, also after a half-finished start:
# every process by PID (daemons from pids/, containerd shims and container processes by the PIDs they recorded
# and the kubelet's cgroups hold), every mount under the paths the cluster used, the kubelet's cgroups, the
# bridge link, the kubelet's iptables chains and sysctls, the shared mount of /var/lib/kubelet and the host
# paths it created. Then it checks that nothing is left and fails if something is. KEEP=1 keeps $RUN (logs).
set -uo pipefail
source "$(dirname "$0")/env.sh"
[ -d "$RUN" ] || { echo "down: no cluster state in $RUN"; exit 0; }

alive() { kill -0 "$1" 2>/dev/null; }
# stop NAME: SIGTERM, then SIGKILL after 10 s, for the daemon whose pid up.sh recorded.
stop() {
  local f=$RUN/pids/$1.pid p
  [ -f "$f" ] || return 0
  p=$(cat "$f")
  if alive "$p"; then
    kill "$p" 2>/dev/null
    for _ in $(seq 50); do alive "$p" || break; sleep 0.2; done
    alive "$p" && kill -9 "$p" 2>/dev/null
  fi
  rm -f "$f"
}
# Let the kubelet unpublish volumes while everything still runs: a clean NodeUnpublish is the best teardown.
if [ -f "$RUN/pids/kubelet.pid" ] && alive "$(cat "$RUN/pids/kubelet.pid")" && [ -f "$KUBECONFIG" ]; then
  # Workload pods first, while the node plugin still serves their unpublish; then the plugin itself.
  timeout 90 kubectl delete pods --all-namespaces --field-selector metadata.namespace!=modelpack --wait=true --grace-period=1 >/dev/null 2>&1 || true
  timeout 60 kubectl -n modelpack delete daemonsets,deployments --all --wait=true >/dev/null 2>&1 || true
  timeout 60 kubectl -n modelpack delete pods --all --wait=true --grace-period=1 >/dev/null 2>&1 || true
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
unmount_under() {
  awk -v p="$1" 'index($2, p) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  done
}
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
if [ -f "$RUN/sysctl.saved" ]; then
  while read -r k v; do echo "$v" > "/proc/sys/$k"; done < "$RUN/sysctl.saved"
fi
# The kubelet's canary chains (iptables and ip6tables) in the tables it probes, when they were not there before.
for t in mangle nat filter; do
  for c in KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT KUBE-FIREWALL KUBE-MARK-DROP KUBE-MARK-MASQ KUBE-POSTROUTING; do
    grep -q "^:$c " "$RUN/iptables-chains.before" 2>/dev/null && continue
    for ipt in iptables ip6tables; do
      $ipt -w -t $t -L $c >/dev/null 2>&1 || continue
      $ipt -w -t $t -S | grep -- "-j $c\b" | sed 's/^-A/-D/' | while read -r rule; do eval $ipt -w -t $t $rule; done
      $ipt -w -t $t -F $c 2>/dev/null; $ipt -w -t $t -X $c 2>/dev/null
    done
  done
done
if [ -f "$RUN/created-paths" ]; then
  # Never recurse into a path that still has something mounted below it.
  while read -r p; do awk -v p="$p" 'index($2, p) == 1' /proc/self/mounts | grep -q . || rm -rf "$p"; done < "$RUN/created-paths"
fi

# ---- nothing may be left ----
left=0
leftover() { echo "down: LEFT BEHIND: $*" >&2; left=1; }
awk -v k="$KUBELET_DIR" -v r="$RUN/" 'index($2, k) == 1 || index($2, r) == 1 || index($2, "/run/netns/cni-") == 1 {print $2}' /proc/self/mounts |
  while read -r m; do echo "mount $m"; done > "$RUN/.leftover-mounts"
[ -s "$RUN/.leftover-mounts" ] && leftover "$(cat "$RUN/.leftover-mounts")"
for f in "$RUN"/pids/*.pid; do [ -f "$f" ] && alive "$(cat "$f")" && leftover "process $(basename "$f" .pid) pid $(cat "$f")"; done
[ -n "$(pod_pids)" ] && leftover "container processes $(pod_pids | tr '\n' ' ')"
for p in $(shim_pids); do alive "$p" && leftover "containerd shim pid $p"; done
ls -d /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods 2>/dev/null | grep -q . && leftover "cgroups $(ls -d /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods 2>/dev/null | tr '\n' ' ')"
ip link show "$BRIDGE" >/dev/null 2>&1 && leftover "link $BRIDGE"
if [ -f "$RUN/sysctl.saved" ]; then
  while read -r k v; do [ "$(cat /proc/sys/$k)" = "$v" ] || leftover "sysctl $k=$(cat /proc/sys/$k), was $v"; done < "$RUN/sysctl.saved"
fi
if [ -f "$RUN/iptables-chains.before" ]; then
  # Built-in chains appear when a table is first used; only chains someone created count.
  iptables-save 2>/dev/null | grep '^:' | cut -d' ' -f1 | grep -vxE ':(INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING)' | sort -u > "$RUN/iptables-chains.after"
  new=$(comm -13 "$RUN/iptables-chains.before" "$RUN/iptables-chains.after" | tr '\n' ' ')
  [ -n "$new" ] && leftover "iptables chains $new"
fi
if [ $left = 0 ]; then
  [ "${KEEP:-0}" = 1 ] || rm -rf "$RUN"
  echo "down: clean"
else
  echo "down: state kept in $RUN for inspection" >&2
  exit 1
fi
