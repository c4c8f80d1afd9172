#!/usr/bin/env bash
# Starts a single-node Kubernetes on 127.0.0.1 from bin/k8s: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, a distribution registry (access log on, so tests count blob GETs), containerd 2.x and kubelet;
# then deploys modelpack the way users do: a locally built image, `kubectl apply -k deploy/overlays/local-cluster`.
# With DRIVER=host the node plugin runs as a host process instead (debugging aid; the suite uses the DaemonSet).
# State, logs and pids live in $RUN; down.sh undoes everything. On failure, up.sh tears down what it started.
set -euo pipefail
source "$(dirname "$0")/env.sh"
source "$(dirname "$0")/lib.sh"

take_lock || exit 1
if [ -d "$RUN/pids" ] && ls "$RUN/pids"/*.pid >/dev/null 2>&1; then
  echo "$RUN/pids holds pids of an earlier cluster: run e2e/cluster/down.sh first" >&2; exit 1
fi
trap 'echo "up.sh failed; tearing down (logs kept in $RUN/logs)" >&2; KEEP=1 bash "$ROOT/e2e/cluster/down.sh" >&2' ERR

for p in $ETCD_PORT $ETCD_PEER_PORT $APISERVER_PORT $REGISTRY_PORT $AUTH_REGISTRY_PORT $KCM_PORT $SCHEDULER_PORT $KUBELET_PORT $KUBELET_HEALTHZ_PORT $DRIVER_METRICS_PORT $PREPULL_METRICS_PORT $REGISTRAR_HEALTH_PORT $LIVENESS_PORT; do
  if (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo "port 127.0.0.1:$p is already in use" >&2; exit 1; fi
done
check_bins

rm -rf "$RUN"
mkdir -p "$RUN"/{pki,logs,pids,etcd,registry,containerd,cni,certs.d,images,node-cache}
T0=$(date +%s)
stamp() { echo "up: $1 at +$(( $(date +%s) - T0 )) s"; }

# What down.sh must restore: host paths that do not exist yet, the sysctls kubelet rewrites, iptables chains.
save_host_state "$KUBELET_SYSCTLS" "$HOST_PATHS"

# ---- PKI ----
pki_ca
pki_cert apiserver /CN=kube-apiserver "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:127.0.0.1,IP:10.0.0.1"
pki_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
pki_cert kubelet-serving /CN=localhost "DNS:localhost,IP:127.0.0.1"
pki_cert admin "/O=system:masters/CN=admin"
pki_cert kubelet "/O=system:nodes/CN=system:node:$NODE"
pki_cert controller-manager /CN=system:kube-controller-manager
pki_cert scheduler /CN=system:kube-scheduler
for u in admin kubelet controller-manager scheduler; do pki_kubeconfig $u "https://127.0.0.1:$APISERVER_PORT"; done
stamp pki

# ---- control plane ----
start_control_plane 127.0.0.1 Hostname 10.0.0.0/24
stamp apiserver-ready

# ---- registry: the access log is how tests count blob GETs ----
start_registry $REGISTRY
stamp registry-ready

# ---- images: busybox for test pods, the sandbox image, and the driver + test registrar ----
img=$RUN/images
push_images $REGISTRY
stamp images-pushed

# ---- containerd ----
sock=$RUN/containerd/containerd.sock
mkdir -p "$RUN/certs.d/$REGISTRY"
printf 'server = "http://%s"\n[host."http://%s"]\n  capabilities = ["pull", "resolve", "push"]\n' $REGISTRY $REGISTRY > "$RUN/certs.d/$REGISTRY/hosts.toml"
write_cni_config "$RUN/cni/10-bridge.conflist" $BRIDGE $POD_CIDR "$RUN/cni/ipam"
write_containerd_config "$RUN/containerd.toml" "$RUN/containerd/root" "$RUN/containerd/state" "$sock" "$RUN/certs.d" \
  "$RUN/cni" "$RUN/runc" "$REGISTRY/e2e/pause:1"
start containerd containerd --config "$RUN/containerd.toml"
waitfor containerd 30 test -S "$sock"
stamp containerd-ready

# ---- kubelet: its directory becomes a shared mount so the node plugin's Bidirectional mounts reach pods ----
mkdir -p "$KUBELET_DIR"
mount --bind "$KUBELET_DIR" "$KUBELET_DIR"
echo "$KUBELET_DIR" > "$RUN/shared-mount"
mount --make-rshared "$KUBELET_DIR"
write_kubelet_config "$RUN/kubelet.yaml" "$sock" 127.0.0.1 $KUBELET_PORT $KUBELET_HEALTHZ_PORT kubelet-serving
kubelet_args=("$K8S_BIN/kubelet" --config "$RUN/kubelet.yaml" --kubeconfig "$RUN/pki/kubelet.kubeconfig"
  --hostname-override "$NODE" --root-dir "$KUBELET_DIR" --v=2)
printf '%s\0' "${kubelet_args[@]}" > "$RUN/kubelet.args"   # for tests that restart the kubelet
start kubelet "${kubelet_args[@]}"
waitfor "node Ready" 180 node_ready $NODE
stamp node-ready
waitfor "default ServiceAccount" 60 kubectl get serviceaccount default

# ---- modelpack ----
if [ "${DRIVER:-daemonset}" = host ]; then
  plugin=$KUBELET_DIR/plugins/modelpack.csi.dev
  mkdir -p "$plugin" "$KUBELET_DIR/plugins_registry"
  start modelpack-csi "$img/modelpack" csi-driver --endpoint "unix://$plugin/csi.sock" --node-id "$NODE" \
    --root "$RUN/node-cache" --plain-http-registries "$REGISTRY" --metrics-addr 127.0.0.1:$DRIVER_METRICS_PORT \
    --prepull-socket "$plugin/prepull.sock" --log-format text --log-level debug
  waitfor "CSI socket" 30 test -S "$plugin/csi.sock"
  start kubelet-registrar "$img/kubelet-registrar" --csi-address "$plugin/csi.sock" \
    --kubelet-registration-path "$plugin/csi.sock" --registration-dir "$KUBELET_DIR/plugins_registry"
  kubectl apply -f "$ROOT/deploy/base/csidriver.yaml" >/dev/null
else
  kubectl apply -k "$ROOT/deploy/overlays/local-cluster" >/dev/null
  kubectl -n modelpack rollout status daemonset/modelpack-node --timeout=180s
  kubectl -n modelpack rollout status daemonset/modelpack-prepull --timeout=120s
fi
waitfor "modelpack.csi.dev on the node" 120 sh -c "kubectl get csinode $NODE -o jsonpath='{.spec.drivers[*].name}' | grep -qw modelpack.csi.dev"
stamp modelpack-ready
trap - ERR
echo "cluster up in $(( $(date +%s) - T0 )) s: KUBECONFIG=$KUBECONFIG registry=$REGISTRY"
