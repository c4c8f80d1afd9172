#!/usr/bin/env bash
# Starts a multi-node Kubernetes on this one machine from bin/k8s: the control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler) and a distribution registry on the host, on the address of a bridge
# created for it; and $NODES worker nodes, each a containerd + kubelet in a network namespace of its own (a veth
# into the bridge, its own address) and a mount namespace of its own (its /var/lib/kubelet, /run/containerd,
# /var/lib/containerd, CNI state, driver cache and Kraken store bound from per-node directories under $RUN).
# Then deploys modelpack as on a real cluster: `kubectl apply -k deploy/overlays/$OVERLAY` (default fleet-cluster-kraken: with Kraken),
# DaemonSets on every node and no per-node manifest. down.sh undoes everything; on failure up.sh tears down.
set -euo pipefail
source "$(dirname "$0")/env.sh"
source "$ROOT/e2e/cluster/lib.sh"
OVERLAY=${OVERLAY:-fleet-cluster-kraken}

take_lock || exit 1
if [ -d "$RUN/pids" ] && ls "$RUN/pids"/*.pid >/dev/null 2>&1; then
  echo "$RUN/pids holds pids of an earlier cluster: run e2e/fleet/cluster/down.sh first" >&2; exit 1
fi
trap 'echo "up.sh failed; tearing down (logs kept in $RUN/logs)" >&2; KEEP=1 bash "$ROOT/e2e/fleet/cluster/down.sh" >&2' ERR
for p in $ETCD_PORT $ETCD_PEER_PORT $APISERVER_PORT $REGISTRY_PORT $KCM_PORT $SCHEDULER_PORT; do
  if (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo "port 127.0.0.1:$p is already in use" >&2; exit 1; fi
done
ip link show "$BRIDGE" >/dev/null 2>&1 && { echo "link $BRIDGE exists: run e2e/fleet/cluster/down.sh first" >&2; exit 1; }
check_bins

rm -rf "$RUN"
mkdir -p "$RUN"/{pki,logs,pids,etcd,registry,certs.d,images,ns,nodes}
T0=$(date +%s)
stamp() { echo "up: $1 at +$(( $(date +%s) - T0 )) s"; }
save_host_state "$KUBELET_SYSCTLS" "$HOST_PATHS"
for b in $NODE_BINDS; do mkdir -p "${b#*=}"; done

# ---- network: a bridge on the host, a namespace per node with a veth into it ----
ip link add "$BRIDGE" type bridge
ip addr add "$HOST_IP/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
for i in $(seq "$NODES"); do
  n=$(node_name $i)
  ip netns add "$n"
  ip link add "${n}h" type veth peer name eth0 netns "$n"
  ip link set "${n}h" master "$BRIDGE" up
  ip -n "$n" addr add "$(node_ip $i)/24" dev eth0
  ip -n "$n" link set eth0 up
  ip -n "$n" link set lo up
done
stamp network

# ---- mount namespaces: each pinned on a file in $RUN/ns (a private mount, as persistent namespaces need) ----
mount --bind "$RUN/ns" "$RUN/ns"
mount --make-private "$RUN/ns"
for i in $(seq "$NODES"); do
  n=$(node_name $i) d=$RUN/nodes/$(node_name $i)
  binds=""
  for b in $NODE_BINDS; do
    mkdir -p "$d/${b%%=*}"
    binds="$binds mount --bind $d/${b%%=*} ${b#*=};"
  done
  touch "$RUN/ns/$n"
  unshare --mount="$RUN/ns/$n" --propagation private true
  # The namespace's copy of $RUN/ns holds the other nodes' namespace files: drop it, so no namespace pins another.
  # The kubelet directory becomes a shared mount, so the node plugin's Bidirectional mounts reach pods.
  nsenter --mount="$RUN/ns/$n" -- sh -ec "umount -R $RUN/ns; $binds mount --make-rshared /var/lib/kubelet"
  nsenter --mount="$RUN/ns/$n" -- readlink /proc/self/ns/mnt > "$d/mntns"
  ip netns exec "$n" readlink /proc/self/ns/net > "$d/netns"
  # The kubelet's cgroup root, in every hierarchy (cgroup v1: one per controller); cpuset needs its cpus and mems.
  for h in /sys/fs/cgroup/*/; do
    [ -f "$h/cgroup.procs" ] || continue
    mkdir -p "$h/mpfleet-$n"
    if [ -f "$h/cpuset.cpus" ]; then cat "$h/cpuset.cpus" > "$h/mpfleet-$n/cpuset.cpus"; cat "$h/cpuset.mems" > "$h/mpfleet-$n/cpuset.mems"; fi
  done
done
stamp namespaces

# ---- PKI ----
pki_ca
pki_cert apiserver /CN=kube-apiserver "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:127.0.0.1,IP:$HOST_IP,IP:10.220.0.1"
pki_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
pki_cert admin "/O=system:masters/CN=admin"
pki_cert controller-manager /CN=system:kube-controller-manager
pki_cert scheduler /CN=system:kube-scheduler
server=https://$HOST_IP:$APISERVER_PORT
for u in admin controller-manager scheduler; do pki_kubeconfig $u "$server"; done
for i in $(seq "$NODES"); do
  n=$(node_name $i)
  pki_cert "kubelet-$n" "/O=system:nodes/CN=system:node:$n"
  pki_cert "kubelet-$n-serving" "/CN=$n" "DNS:$n,IP:$(node_ip $i)"
  pki_kubeconfig "kubelet-$n" "$server"
done
stamp pki

# ---- control plane and registry, on the bridge's address ----
start_control_plane "$HOST_IP" InternalIP 10.220.0.0/24
stamp apiserver-ready
start_registry "$REGISTRY"
push_images "$REGISTRY"
# Kraken's image, built as `make kraken-image` builds it (no container engine).
bash "$ROOT/e2e/fleet/kraken-image.sh" "$REGISTRY/e2e/kraken:v0.1.27" > "$RUN/images/kraken.ref"
stamp images-pushed

# ---- nodes: containerd, then the kubelet, each inside its node's namespaces ----
mkdir -p "$RUN/certs.d/$REGISTRY"
printf 'server = "http://%s"\n[host."http://%s"]\n  capabilities = ["pull", "resolve"]\n' $REGISTRY $REGISTRY > "$RUN/certs.d/$REGISTRY/hosts.toml"
for i in $(seq "$NODES"); do
  n=$(node_name $i) d=$RUN/nodes/$(node_name $i)
  write_cni_config "$d/cni-conf/10-bridge.conflist" mpfcni0 "$POD_NET.$i.0/24" /var/lib/cni/networks
  # Pod network namespaces under the node's state dir (its own /run/containerd), not the shared /run/netns.
  write_containerd_config "$d/containerd.toml" /var/lib/containerd /run/containerd /run/containerd/containerd.sock \
    "$RUN/certs.d" /etc/cni/net.d /run/containerd/runc "$REGISTRY/e2e/pause:1" "  netns_mounts_under_state_dir = true"
  start "containerd-$n" nsenter --net=/run/netns/$n --mount="$RUN/ns/$n" -- "$K8S_BIN/containerd" --config "$d/containerd.toml"
done
for i in $(seq "$NODES"); do
  n=$(node_name $i) d=$RUN/nodes/$(node_name $i)
  waitfor "containerd on $n" 30 test -S "$d/run/containerd.sock"
  write_kubelet_config "$d/kubelet.yaml" /run/containerd/containerd.sock "$(node_ip $i)" $KUBELET_PORT $KUBELET_HEALTHZ_PORT \
    "kubelet-$n-serving" "cgroupRoot: /mpfleet-$n"
  args=(nsenter --net=/run/netns/$n --mount="$RUN/ns/$n" -- "$K8S_BIN/kubelet" --config "$d/kubelet.yaml" --kubeconfig "$RUN/pki/kubelet-$n.kubeconfig"
    --hostname-override "$n" --node-ip "$(node_ip $i)" --root-dir /var/lib/kubelet --v=2)
  printf '%s\0' "${args[@]}" > "$d/kubelet.args"
  start "kubelet-$n" "${args[@]}"
done
stamp containerd-ready
for i in $(seq "$NODES"); do waitfor "node $(node_name $i) Ready" 180 node_ready "$(node_name $i)"; done
stamp nodes-ready
waitfor "default ServiceAccount" 60 kubectl get serviceaccount default
for i in $(seq "$NODES"); do
  echo "$(node_name $i) $(node_ip $i)"
done > "$RUN/nodes.txt"
echo "$REGISTRY" > "$RUN/registry.addr"

# ---- modelpack, as on a real cluster ----
kubectl apply -k "$ROOT/deploy/overlays/$OVERLAY" >/dev/null
kubectl -n modelpack rollout status daemonset/modelpack-node --timeout=300s
kubectl -n modelpack rollout status daemonset/modelpack-prepull --timeout=180s
if kubectl -n modelpack get daemonset kraken-agent >/dev/null 2>&1; then
  kubectl -n modelpack rollout status statefulset/kraken-origin --timeout=180s
  kubectl -n modelpack rollout status deployment/kraken-tracker --timeout=180s
  kubectl -n modelpack rollout status deployment/kraken-build-index --timeout=180s
  kubectl -n modelpack rollout status daemonset/kraken-agent --timeout=180s
fi
for i in $(seq "$NODES"); do
  waitfor "modelpack.csi.dev on $(node_name $i)" 120 sh -c "kubectl get csinode $(node_name $i) -o jsonpath='{.spec.drivers[*].name}' | grep -qw modelpack.csi.dev"
done
stamp modelpack-ready
trap - ERR
echo "fleet cluster up in $(( $(date +%s) - T0 )) s: $NODES nodes, KUBECONFIG=$KUBECONFIG registry=$REGISTRY"
