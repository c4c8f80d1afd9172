#!/usr/bin/env bash
# Starts a single-node Kubernetes on 127.0.0.1 from bin/k8s: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, a distribution registry (access log on, so tests count blob GETs), containerd 2.x and kubelet;
# then deploys modelpack the way users do: a locally built image, `kubectl apply -k deploy/overlays/local-cluster`.
# With DRIVER=host the node plugin runs as a host process instead (debugging aid; the suite uses the DaemonSet).
# State, logs and pids live in $RUN; down.sh undoes everything. On failure, up.sh tears down what it started.
set -euo pipefail
source "$(dirname "$0")/env.sh"

# A caller that holds the lock already (run.sh) passes it down as fd 9; reopening would make a second,
# conflicting lock on the same file.
[ "$(readlink /proc/$$/fd/9 2>/dev/null)" = "$LOCK" ] || exec 9>>"$LOCK"
if ! flock -n 9; then
  echo "another local cluster holds $LOCK; waiting for it (up to ${LOCK_WAIT:-1800} s)" >&2
  flock -w "${LOCK_WAIT:-1800}" 9 || { echo "cluster lock $LOCK still busy" >&2; exit 1; }
fi
if [ -d "$RUN/pids" ] && ls "$RUN/pids"/*.pid >/dev/null 2>&1; then
  echo "$RUN/pids holds pids of an earlier cluster: run e2e/cluster/down.sh first" >&2; exit 1
fi
trap 'echo "up.sh failed; tearing down (logs kept in $RUN/logs)" >&2; KEEP=1 bash "$ROOT/e2e/cluster/down.sh" >&2' ERR

for p in $ETCD_PORT $ETCD_PEER_PORT $APISERVER_PORT $REGISTRY_PORT $AUTH_REGISTRY_PORT $KCM_PORT $SCHEDULER_PORT $KUBELET_PORT $KUBELET_HEALTHZ_PORT $DRIVER_METRICS_PORT $PREPULL_METRICS_PORT $REGISTRAR_HEALTH_PORT $LIVENESS_PORT; do
  if (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo "port 127.0.0.1:$p is already in use" >&2; exit 1; fi
done
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl containerd containerd-shim-runc-v2; do
  [ -x "$K8S_BIN/$b" ] || { echo "$K8S_BIN/$b missing: run e2e/cluster/build.sh" >&2; exit 1; }
done
for b in runc busybox iptables conntrack; do command -v $b >/dev/null || { echo "$b missing: run e2e/cluster/deps.sh" >&2; exit 1; }; done
[ -x /usr/lib/cni/bridge ] || { echo "CNI plugins missing: run e2e/cluster/deps.sh" >&2; exit 1; }

rm -rf "$RUN"
mkdir -p "$RUN"/{pki,logs,pids,etcd,registry,containerd,cni,certs.d,images,node-cache}
T0=$(date +%s)
stamp() { echo "up: $1 at +$(( $(date +%s) - T0 )) s"; }
# start NAME CMD...: a daemon in the background; its pid goes to pids/NAME.pid, output to logs/NAME.log.
start() { local name=$1; shift; "$@" > "$RUN/logs/$name.log" 2>&1 & echo $! > "$RUN/pids/$name.pid"; }
waitfor() { # WHAT SECONDS CMD...
  local what=$1 n=$2; shift 2
  for _ in $(seq $((n * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "timed out after $n s waiting for $what" >&2; return 1
}

# What down.sh must restore: host paths that do not exist yet, the sysctls kubelet rewrites, iptables chains.
for p in $HOST_PATHS; do [ -e "$p" ] || echo "$p"; done > "$RUN/created-paths"
for k in $KUBELET_SYSCTLS; do echo "$k $(cat /proc/sys/$k)"; done > "$RUN/sysctl.saved"
iptables-save 2>/dev/null | grep '^:' | cut -d' ' -f1 | sort -u > "$RUN/iptables-chains.before" || true

# ---- PKI ----
(
  cd "$RUN/pki"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=modelpack-e2e-ca 2>/dev/null
  cert() { # NAME SUBJECT [SAN]
    openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n%s\n' "${3:+subjectAltName=$3}" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 2 -extfile "$1.ext" 2>/dev/null
  }
  cert apiserver /CN=kube-apiserver "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:127.0.0.1,IP:10.0.0.1"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  cert kubelet-serving /CN=localhost "DNS:localhost,IP:127.0.0.1"
  cert admin "/O=system:masters/CN=admin"
  cert kubelet "/O=system:nodes/CN=system:node:$NODE"
  cert controller-manager /CN=system:kube-controller-manager
  cert scheduler /CN=system:kube-scheduler
  openssl genrsa -out sa.key 2048 2>/dev/null && openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  for u in admin kubelet controller-manager scheduler; do
    cat > $u.kubeconfig <<KC
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:$APISERVER_PORT", certificate-authority: $RUN/pki/ca.crt}
users:
- name: $u
  user: {client-certificate: $RUN/pki/$u.crt, client-key: $RUN/pki/$u.key}
contexts:
- name: local
  context: {cluster: local, user: $u}
current-context: local
KC
  done
)
stamp pki

# ---- control plane ----
start etcd etcd --name local --data-dir "$RUN/etcd" --unsafe-no-fsync \
  --listen-client-urls http://127.0.0.1:$ETCD_PORT --advertise-client-urls http://127.0.0.1:$ETCD_PORT \
  --listen-peer-urls http://127.0.0.1:$ETCD_PEER_PORT --initial-advertise-peer-urls http://127.0.0.1:$ETCD_PEER_PORT \
  --initial-cluster local=http://127.0.0.1:$ETCD_PEER_PORT --listen-metrics-urls ""
waitfor etcd 30 curl -sf http://127.0.0.1:$ETCD_PORT/health
start kube-apiserver kube-apiserver --etcd-servers=http://127.0.0.1:$ETCD_PORT \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port=$APISERVER_PORT \
  --endpoint-reconciler-type=none \
  --tls-cert-file="$RUN/pki/apiserver.crt" --tls-private-key-file="$RUN/pki/apiserver.key" --client-ca-file="$RUN/pki/ca.crt" \
  --kubelet-client-certificate="$RUN/pki/apiserver-kubelet-client.crt" --kubelet-client-key="$RUN/pki/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types=Hostname --kubelet-certificate-authority="$RUN/pki/ca.crt" \
  --service-account-key-file="$RUN/pki/sa.pub" --service-account-signing-key-file="$RUN/pki/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=10.0.0.0/24 \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
  --allow-privileged=true --profiling=false
waitfor kube-apiserver 120 kubectl get --raw /readyz
stamp apiserver-ready
start kube-controller-manager kube-controller-manager --kubeconfig="$RUN/pki/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=$KCM_PORT --leader-elect=false \
  --service-account-private-key-file="$RUN/pki/sa.key" --root-ca-file="$RUN/pki/ca.crt" \
  --cluster-signing-cert-file="$RUN/pki/ca.crt" --cluster-signing-key-file="$RUN/pki/ca.key" \
  --use-service-account-credentials=true \
  --profiling=false
start kube-scheduler kube-scheduler --kubeconfig="$RUN/pki/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=$SCHEDULER_PORT --leader-elect=false --profiling=false

# ---- registry: the access log is how tests count blob GETs ----
cat > "$RUN/registry.yml" <<YML
version: 0.1
log:
  level: warn
  accesslog: {disabled: false}
storage:
  filesystem: {rootdirectory: $RUN/registry}
  delete: {enabled: true}
http:
  addr: $REGISTRY
YML
OTEL_TRACES_EXPORTER=none start registry registry serve "$RUN/registry.yml"
waitfor registry 30 curl -sf http://$REGISTRY/v2/
stamp registry-ready

# ---- images: busybox for test pods, the sandbox image, and the driver + test registrar ----
img=$RUN/images
( cd "$ROOT" && go build -trimpath -o "$img/ociimage" ./e2e/cmd/ociimage && \
  CGO_ENABLED=0 go build -trimpath -o "$img/kubelet-registrar" ./e2e/cmd/kubelet-registrar && \
  CGO_ENABLED=0 go build -trimpath -o "$img/csi-livenessprobe" ./e2e/cmd/csi-livenessprobe && \
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$img/modelpack" ./cli/modelpack ) # the suite's host-side CLI
busybox=$(command -v busybox)
applets=""
for a in sh cat ls sleep echo true false test find head tail wc sha256sum stat dd touch mount umount grep sed awk cut tr sort xargs id df wget; do
  applets="$applets --link /bin/$a=busybox"
done
"$img/ociimage" --file "$busybox=/bin/busybox" $applets --cmd /bin/sh $REGISTRY/e2e/busybox:1 > "$img/busybox.ref"
"$img/ociimage" --file "$busybox=/bin/busybox" --link /bin/sleep=busybox --entrypoint /bin/sleep,2147483647 $REGISTRY/e2e/pause:1 > /dev/null
# A real inference program for test pods: Debian's tesseract (OCR) with exactly the shared libraries it loads, and
# no model: the pods mount theirs through the driver.
elf=(--file "$(command -v tesseract)=/usr/bin/tesseract")
while read -r lib; do elf+=(--file "$lib=$lib"); done < <(ldd "$(command -v tesseract)" | grep -o '/[^ ]*' | sort -u)
"$img/ociimage" "${elf[@]}" --entrypoint /usr/bin/tesseract $REGISTRY/e2e/tesseract:1 > "$img/tesseract.ref"
# The driver image as `make image` builds it (internal/cmd/image): the same binary-and-CA-bundle image, here for
# linux/amd64 only (containerd picks it from the index as from the published one; arm64 would only cost time).
( cd "$ROOT" && go run ./internal/cmd/image --version e2e --platforms linux/amd64 $REGISTRY/modelpack/modelpack:e2e ) > "$img/modelpack.ref"
"$img/ociimage" --file "$img/kubelet-registrar=/usr/local/bin/kubelet-registrar" \
  --entrypoint /usr/local/bin/kubelet-registrar $REGISTRY/e2e/kubelet-registrar:1 > /dev/null
"$img/ociimage" --file "$img/csi-livenessprobe=/usr/local/bin/csi-livenessprobe" \
  --entrypoint /usr/local/bin/csi-livenessprobe $REGISTRY/e2e/csi-livenessprobe:1 > /dev/null
stamp images-pushed

# ---- containerd ----
sock=$RUN/containerd/containerd.sock
mkdir -p "$RUN/certs.d/$REGISTRY"
printf 'server = "http://%s"\n[host."http://%s"]\n  capabilities = ["pull", "resolve", "push"]\n' $REGISTRY $REGISTRY > "$RUN/certs.d/$REGISTRY/hosts.toml"
cat > "$RUN/cni/10-bridge.conflist" <<CNI
{"cniVersion": "1.0.0", "name": "modelpack-e2e", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": false, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": "$RUN/cni/ipam", "ranges": [[{"subnet": "$POD_CIDR"}]]}}]}
CNI
cat > "$RUN/containerd.toml" <<TOML
version = 3
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[debug]
  address = "$sock.debug"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$REGISTRY/e2e/pause:1"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$RUN/certs.d"
[plugins.'io.containerd.cri.v1.runtime']
  # These VMs withhold CAP_SYS_RESOURCE: a negative oom_score_adj fails runc ("can't get final child's PID
  # from pipe: EOF"), so clamp it to containerd's own.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$RUN/cni"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "$(command -v runc)"
      SystemdCgroup = false
      Root = "$RUN/runc"
TOML
start containerd containerd --config "$RUN/containerd.toml"
waitfor containerd 30 test -S "$sock"
stamp containerd-ready

# ---- kubelet: its directory becomes a shared mount so the node plugin's Bidirectional mounts reach pods ----
mkdir -p "$KUBELET_DIR"
mount --bind "$KUBELET_DIR" "$KUBELET_DIR"
echo "$KUBELET_DIR" > "$RUN/shared-mount"
mount --make-rshared "$KUBELET_DIR"
cat > "$RUN/kubelet.yaml" <<YML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$sock
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $RUN/pki/kubelet-serving.crt
tlsPrivateKeyFile: $RUN/pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $RUN/pki/ca.crt}
authorization: {mode: AlwaysAllow}
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
registerNode: true
serializeImagePulls: false
syncFrequency: 10s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
YML
kubelet_args=("$K8S_BIN/kubelet" --config "$RUN/kubelet.yaml" --kubeconfig "$RUN/pki/kubelet.kubeconfig"
  --hostname-override "$NODE" --root-dir "$KUBELET_DIR" --v=2)
printf '%s\0' "${kubelet_args[@]}" > "$RUN/kubelet.args"   # for tests that restart the kubelet
start kubelet "${kubelet_args[@]}"
waitfor "node Ready" 180 sh -c "kubectl get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
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
