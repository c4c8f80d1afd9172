# Settings of the multi-node local cluster (source it). It shares the single-node cluster's lock, so the two never
# run at once, and still uses ports, paths, a bridge and a subnet of its own.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
K8S_BIN=${K8S_BIN:-$ROOT/bin/k8s}
RUN=${MODELPACK_FLEET_DIR:-/tmp/modelpack-fleet}
LOCK=/tmp/modelpack-cluster.lock
# Worker nodes: node i is "mpf$i" (its network namespace, its node name) at $SUBNET.$((10+i)).
NODES=${FLEET_NODES:-3}
SUBNET=10.218.0
HOST_IP=$SUBNET.1          # the bridge's address on the host: apiserver and registry listen here
BRIDGE=mpfleet0
# Pods of node i (bridge CNI inside the node's namespace): 10.219.i.0/24.
POD_NET=10.219
ETCD_PORT=23379 ETCD_PEER_PORT=23380 APISERVER_PORT=27443 REGISTRY_PORT=25100
# A private registry (htpasswd, TLS from a test CA) that TestKrakenPrivateModel starts itself on the bridge.
AUTH_REGISTRY_PORT=25101
KCM_PORT=21257 SCHEDULER_PORT=21259 KUBELET_PORT=10250 KUBELET_HEALTHZ_PORT=10248
REGISTRY=$HOST_IP:$REGISTRY_PORT
# The per-node directories a node's mount namespace binds over these host paths (name=path).
NODE_BINDS="kubelet=/var/lib/kubelet containerd=/var/lib/containerd run=/run/containerd cni-conf=/etc/cni/net.d cni=/var/lib/cni pods-log=/var/log/pods containers-log=/var/log/containers cache=/var/lib/modelpack kraken=/var/lib/kraken-agent"
# Sysctls the kubelet sets on start (global, not per network namespace): saved once, restored by down.sh.
KUBELET_SYSCTLS="vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes"
# Mount points the namespaces need on the host; down.sh removes those that did not exist before up.sh.
HOST_PATHS="/var/lib/kubelet /var/lib/containerd /run/containerd /etc/cni /var/lib/cni /var/log/pods /var/log/containers /var/lib/modelpack /var/lib/kraken-agent"
export KUBECONFIG=$RUN/pki/admin.kubeconfig
export PATH=$K8S_BIN:$ROOT/bin/tools:$ROOT/bin:$PATH
node_name() { echo "mpf$1"; }
node_ip() { echo "$SUBNET.$((10 + $1))"; }
# on_node I CMD...: CMD in node i's network and mount namespaces.
on_node() { local i=$1; shift; nsenter --net=/run/netns/mpf$i --mount="$RUN/ns/mpf$i" -- "$@"; }
