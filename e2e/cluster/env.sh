# Shared settings of the local cluster scripts (source it). One cluster per machine at a time: up.sh takes
# $LOCK and every daemon it starts inherits it, so the lock is held until down.sh has stopped them all.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
K8S_BIN=${K8S_BIN:-$ROOT/bin/k8s}
RUN=${MODELPACK_CLUSTER_DIR:-/tmp/modelpack-cluster}
LOCK=/tmp/modelpack-cluster.lock
NODE=localhost
# Fixed ports below the ephemeral range, so tests that pick random ports never take them.
ETCD_PORT=22379 ETCD_PEER_PORT=22380 APISERVER_PORT=26443 REGISTRY_PORT=25000
# A second registry, with htpasswd, that tests of tenants start and stop themselves (the shared one stays open).
AUTH_REGISTRY_PORT=25001
KCM_PORT=20257 SCHEDULER_PORT=20259 KUBELET_PORT=10250 KUBELET_HEALTHZ_PORT=10248
DRIVER_METRICS_PORT=29808 PREPULL_METRICS_PORT=29809 REGISTRAR_HEALTH_PORT=29810 LIVENESS_PORT=29898
REGISTRY=127.0.0.1:$REGISTRY_PORT
BRIDGE=mpk8s0
POD_CIDR=10.217.0.0/24
KUBELET_DIR=/var/lib/kubelet
# Sysctls kubelet sets on start; saved before and restored by down.sh.
KUBELET_SYSCTLS="vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes"
# Host paths the cluster may create; down.sh removes those that did not exist before up.sh.
HOST_PATHS="$KUBELET_DIR /var/log/pods /var/log/containers /var/lib/cni /run/containerd /run/nri /run/netns /var/run/netns /etc/cni"
export KUBECONFIG=$RUN/pki/admin.kubeconfig
export PATH=$K8S_BIN:$ROOT/bin/tools:$ROOT/bin:$PATH
