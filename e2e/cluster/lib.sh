# Functions both local clusters share (source it after setting the variables named below): e2e/cluster (one node
# on 127.0.0.1) and e2e/fleet/cluster (several nodes, each in its own network and mount namespace). Each function
# reads its settings from the caller's variables: RUN (state directory), ROOT, K8S_BIN, LOCK.

# take_lock: the cluster lock on fd 9, waiting up to LOCK_WAIT seconds. A caller that holds it already (run.sh)
# passes it down as fd 9; reopening would make a second, conflicting lock on the same file.
take_lock() {
  [ "$(readlink /proc/$$/fd/9 2>/dev/null)" = "$LOCK" ] || exec 9>>"$LOCK"
  if ! flock -n 9; then
    echo "another local cluster holds $LOCK; waiting for it (up to ${LOCK_WAIT:-1800} s)" >&2
    flock -w "${LOCK_WAIT:-1800}" 9 || { echo "cluster lock $LOCK still busy" >&2; return 1; }
  fi
}

# start NAME CMD...: a daemon in the background; its pid goes to pids/NAME.pid, output to logs/NAME.log.
start() { local name=$1; shift; "$@" > "$RUN/logs/$name.log" 2>&1 & echo $! > "$RUN/pids/$name.pid"; }

# waitfor WHAT SECONDS CMD...: polls CMD until it succeeds.
waitfor() {
  local what=$1 n=$2; shift 2
  for _ in $(seq $((n * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "timed out after $n s waiting for $what" >&2; return 1
}

alive() { kill -0 "$1" 2>/dev/null; }

# stop NAME: SIGTERM, then SIGKILL after 10 s, for the daemon whose pid start recorded.
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

check_bins() {
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl containerd containerd-shim-runc-v2; do
    [ -x "$K8S_BIN/$b" ] || { echo "$K8S_BIN/$b missing: run e2e/cluster/build.sh" >&2; return 1; }
  done
  for b in runc busybox iptables conntrack; do command -v $b >/dev/null || { echo "$b missing: run e2e/cluster/deps.sh" >&2; return 1; }; done
  [ -x /usr/lib/cni/bridge ] || { echo "CNI plugins missing: run e2e/cluster/deps.sh" >&2; return 1; }
}

# save_host_state SYSCTLS PATHS: what the teardown must restore — host paths that do not exist yet, the sysctls
# the kubelet rewrites, the iptables chains that exist now.
save_host_state() {
  local p k
  for p in $2; do [ -e "$p" ] || echo "$p"; done > "$RUN/created-paths"
  for k in $1; do echo "$k $(cat /proc/sys/$k)"; done > "$RUN/sysctl.saved"
  iptables-save 2>/dev/null | grep '^:' | cut -d' ' -f1 | sort -u > "$RUN/iptables-chains.before" || true
}

# pki_ca, then pki_cert NAME SUBJECT [SAN] and pki_kubeconfig USER SERVER, all in $RUN/pki.
pki_ca() {
  (cd "$RUN/pki" && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=modelpack-e2e-ca 2>/dev/null)
  (cd "$RUN/pki" && openssl genrsa -out sa.key 2048 2>/dev/null && openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null)
}
pki_cert() {
  (
    cd "$RUN/pki"
    openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n%s\n' "${3:+subjectAltName=$3}" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 2 -extfile "$1.ext" 2>/dev/null
  )
}
pki_kubeconfig() {
  cat > "$RUN/pki/$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "$2", certificate-authority: $RUN/pki/ca.crt}
users:
- name: $1
  user: {client-certificate: $RUN/pki/$1.crt, client-key: $RUN/pki/$1.key}
contexts:
- name: local
  context: {cluster: local, user: $1}
current-context: local
KC
}

# start_control_plane ADDR PREFERRED_ADDRESS_TYPES SERVICE_CIDR: etcd (loopback), kube-apiserver on ADDR, the
# controller-manager and the scheduler; waits for the apiserver. Ports: ETCD_PORT ETCD_PEER_PORT APISERVER_PORT
# KCM_PORT SCHEDULER_PORT.
start_control_plane() {
  local addr=$1 prefer=$2 svc=$3
  start etcd etcd --name local --data-dir "$RUN/etcd" --unsafe-no-fsync \
    --listen-client-urls http://127.0.0.1:$ETCD_PORT --advertise-client-urls http://127.0.0.1:$ETCD_PORT \
    --listen-peer-urls http://127.0.0.1:$ETCD_PEER_PORT --initial-advertise-peer-urls http://127.0.0.1:$ETCD_PEER_PORT \
    --initial-cluster local=http://127.0.0.1:$ETCD_PEER_PORT --listen-metrics-urls ""
  waitfor etcd 30 curl -sf http://127.0.0.1:$ETCD_PORT/health
  start kube-apiserver kube-apiserver --etcd-servers=http://127.0.0.1:$ETCD_PORT \
    --bind-address="$addr" --advertise-address="$addr" --secure-port=$APISERVER_PORT \
    --endpoint-reconciler-type=none \
    --tls-cert-file="$RUN/pki/apiserver.crt" --tls-private-key-file="$RUN/pki/apiserver.key" --client-ca-file="$RUN/pki/ca.crt" \
    --kubelet-client-certificate="$RUN/pki/apiserver-kubelet-client.crt" --kubelet-client-key="$RUN/pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types="$prefer" --kubelet-certificate-authority="$RUN/pki/ca.crt" \
    --service-account-key-file="$RUN/pki/sa.pub" --service-account-signing-key-file="$RUN/pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range="$svc" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true --profiling=false
  waitfor kube-apiserver 120 kubectl get --raw /readyz
  start kube-controller-manager kube-controller-manager --kubeconfig="$RUN/pki/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=$KCM_PORT --leader-elect=false \
    --service-account-private-key-file="$RUN/pki/sa.key" --root-ca-file="$RUN/pki/ca.crt" \
    --cluster-signing-cert-file="$RUN/pki/ca.crt" --cluster-signing-key-file="$RUN/pki/ca.key" \
    --use-service-account-credentials=true \
    --profiling=false
  start kube-scheduler kube-scheduler --kubeconfig="$RUN/pki/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=$SCHEDULER_PORT --leader-elect=false --profiling=false
}

# start_registry HOST:PORT: a distribution registry with its access log on (how tests count blob GETs).
start_registry() {
  cat > "$RUN/registry.yml" <<YML
version: 0.1
log:
  level: warn
  accesslog: {disabled: false}
storage:
  filesystem: {rootdirectory: $RUN/registry}
  delete: {enabled: true}
http:
  addr: $1
YML
  OTEL_TRACES_EXPORTER=none start registry registry serve "$RUN/registry.yml"
  waitfor registry 30 curl -sf http://$1/v2/
}

# push_images REGISTRY: busybox and tesseract for test pods, the sandbox image, the driver image as `make image` builds it,
# the registrar and livenessprobe stand-ins; and the host-side CLI the suites pack with, all in $RUN/images.
push_images() {
  local reg=$1 img=$RUN/images busybox applets="" a
  ( cd "$ROOT" && go build -trimpath -o "$img/ociimage" ./e2e/cmd/ociimage && \
    CGO_ENABLED=0 go build -trimpath -o "$img/kubelet-registrar" ./e2e/cmd/kubelet-registrar && \
    CGO_ENABLED=0 go build -trimpath -o "$img/csi-livenessprobe" ./e2e/cmd/csi-livenessprobe && \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$img/modelpack" ./cli/modelpack ) # the suite's host-side CLI
  busybox=$(command -v busybox)
  for a in sh cat ls sleep echo true false test find head tail wc sha256sum stat dd touch mount umount grep sed awk cut tr sort xargs id df wget; do
    applets="$applets --link /bin/$a=busybox"
  done
  "$img/ociimage" --file "$busybox=/bin/busybox" $applets --cmd /bin/sh $reg/e2e/busybox:1 > "$img/busybox.ref"
  "$img/ociimage" --file "$busybox=/bin/busybox" --link /bin/sleep=busybox --entrypoint /bin/sleep,2147483647 $reg/e2e/pause:1 > /dev/null
  # A real inference program for test pods: Debian's tesseract (OCR) with the shared libraries it loads, and no
  # model: the pods mount theirs through the driver.
  "$img/ociimage" --libs --file "$(command -v tesseract)=/usr/bin/tesseract" --entrypoint /usr/bin/tesseract $reg/e2e/tesseract:1 > "$img/tesseract.ref"
  # The driver image as `make image` builds it (internal/cmd/image): the same binary-and-CA-bundle image, here for
  # linux/amd64 only (containerd picks it from the index as from the published one; arm64 would only cost time).
  ( cd "$ROOT" && go run ./internal/cmd/image --version e2e --platforms linux/amd64 $reg/modelpack/modelpack:e2e ) > "$img/modelpack.ref"
  "$img/ociimage" --file "$img/kubelet-registrar=/usr/local/bin/kubelet-registrar" \
    --entrypoint /usr/local/bin/kubelet-registrar $reg/e2e/kubelet-registrar:1 > /dev/null
  "$img/ociimage" --file "$img/csi-livenessprobe=/usr/local/bin/csi-livenessprobe" \
    --entrypoint /usr/local/bin/csi-livenessprobe $reg/e2e/csi-livenessprobe:1 > /dev/null
}

# write_containerd_config FILE ROOT STATE SOCK CERTS_D CNI_CONF_DIR RUNC_ROOT SANDBOX [EXTRA_RUNTIME_TOML]
write_containerd_config() {
  cat > "$1" <<TOML
version = 3
root = "$2"
state = "$3"
[grpc]
  address = "$4"
[ttrpc]
  address = "$4.ttrpc"
[debug]
  address = "$4.debug"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$8"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$5"
[plugins.'io.containerd.cri.v1.runtime']
  # These VMs withhold CAP_SYS_RESOURCE: a negative oom_score_adj fails runc ("can't get final child's PID
  # from pipe: EOF"), so clamp it to containerd's own.
  restrict_oom_score_adj = true
${9:-}
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$6"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "$(command -v runc)"
      SystemdCgroup = false
      Root = "$7"
TOML
}

# write_cni_config FILE BRIDGE SUBNET IPAM_DATA_DIR: the bridge CNI config a node needs to be Ready.
write_cni_config() {
  cat > "$1" <<CNI
{"cniVersion": "1.0.0", "name": "modelpack-e2e", "plugins": [
  {"type": "bridge", "bridge": "$2", "isGateway": false, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": "$4", "ranges": [[{"subnet": "$3"}]]}}]}
CNI
}

# write_kubelet_config FILE SOCK ADDRESS PORT HEALTHZ_PORT SERVING_CERT_NAME [EXTRA_YAML]
write_kubelet_config() {
  cat > "$1" <<YML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$2
address: $3
port: $4
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $5
tlsCertFile: $RUN/pki/$6.crt
tlsPrivateKeyFile: $RUN/pki/$6.key
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
${7:-}
YML
}

# node_ready NODE: the node reports Ready.
node_ready() { kubectl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True; }

# ---- teardown ----

# drain_pods: let the kubelets unpublish volumes while everything still runs (a clean NodeUnpublish is the best
# teardown): workload pods first, while the node plugin still serves their unpublish; then the plugin itself.
drain_pods() {
  timeout 90 kubectl delete pods --all-namespaces --field-selector metadata.namespace!=modelpack --wait=true --grace-period=1 >/dev/null 2>&1 || true
  timeout 60 kubectl -n modelpack delete daemonsets,deployments,statefulsets --all --wait=true >/dev/null 2>&1 || true
  timeout 60 kubectl -n modelpack delete pods --all --wait=true --grace-period=1 >/dev/null 2>&1 || true
}

# unmount_under PREFIX: every mount below PREFIX, deepest first (in the caller's mount namespace).
unmount_under() {
  awk -v p="$1" 'index($2, p) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  done
}

restore_sysctls() {
  [ -f "$RUN/sysctl.saved" ] || return 0
  local k v
  while read -r k v; do echo "$v" > "/proc/sys/$k"; done < "$RUN/sysctl.saved"
}

# remove_kubelet_chains: the kubelet's canary chains (iptables and ip6tables) in the tables it probes, in the
# caller's network namespace, when they were not there before.
remove_kubelet_chains() {
  local t c ipt rule
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
}

# remove_created_paths: the host paths up.sh created, never recursing into one with a mount below it.
remove_created_paths() {
  [ -f "$RUN/created-paths" ] || return 0
  local p
  while read -r p; do awk -v p="$p" 'index($2, p) == 1' /proc/self/mounts | grep -q . || rm -rf "$p"; done < "$RUN/created-paths"
}

# Leftover checks: leftover records what is left; check_host_state checks sysctls and iptables chains.
left=0
leftover() { echo "down: LEFT BEHIND: $*" >&2; left=1; }
check_host_state() {
  local k v new
  if [ -f "$RUN/sysctl.saved" ]; then
    while read -r k v; do [ "$(cat /proc/sys/$k)" = "$v" ] || leftover "sysctl $k=$(cat /proc/sys/$k), was $v"; done < "$RUN/sysctl.saved"
  fi
  if [ -f "$RUN/iptables-chains.before" ]; then
    # Built-in chains appear when a table is first used; only chains someone created count.
    iptables-save 2>/dev/null | grep '^:' | cut -d' ' -f1 | grep -vxE ':(INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING)' | sort -u > "$RUN/iptables-chains.after"
    new=$(comm -13 "$RUN/iptables-chains.before" "$RUN/iptables-chains.after" | tr '\n' ' ')
    [ -n "$new" ] && leftover "iptables chains $new"
  fi
  for f in "$RUN"/pids/*.pid; do [ -f "$f" ] && alive "$(cat "$f")" && leftover "process $(basename "$f" .pid) pid $(cat "$f")"; done
}
# finish_down: removes $RUN (unless KEEP=1) when nothing is left, else keeps it and fails.
finish_down() {
  if [ $left = 0 ]; then
    [ "${KEEP:-0}" = 1 ] || rm -rf "$RUN"
    echo "down: clean"
  else
    echo "down: state kept in $RUN for inspection" >&2
    exit 1
  fi
}
