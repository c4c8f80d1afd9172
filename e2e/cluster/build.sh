#!/usr/bin/env bash
# Builds the pinned single-node Kubernetes toolchain into bin/k8s from the Go module proxy alone:
# kube-apiserver, kube-controller-manager, kubelet, kubectl (k8s.io/kubernetes through a wrapper module), etcd
# (a wrapper main), containerd + shim + ctr. A binary already built at its pinned version is kept (bin/k8s/.versions).
# The Debian parts (runc, CNI plugins, busybox-static, iptables, conntrack) come from deps.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
K8S_VERSION=${K8S_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.8}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
OUT=${K8S_BIN:-$ROOT/bin/k8s}
WORK=$OUT/.build
export GOFLAGS="-mod=mod -trimpath" CGO_ENABLED=0 GOWORK=off
mkdir -p "$OUT" "$WORK"
touch "$OUT/.versions"
# Parts to build: arguments among etcd, containerd, kubernetes (default all), so parts can build in parallel.
parts=" ${*:-etcd containerd kubernetes} "
want() { [[ $parts == *" $1 "* ]]; }

# fresh NAME VERSION: true if bin/k8s/NAME exists and was built at VERSION.
fresh() { [ -x "$OUT/$1" ] && grep -qx "$1 $2" "$OUT/.versions"; }
built() { sed -i "/^$1 /d" "$OUT/.versions"; echo "$1 $2" >> "$OUT/.versions"; echo "built $1 $2 in $(( $(date +%s) - $3 )) s"; }

if want etcd && ! fresh etcd "$ETCD_VERSION"; then
  t0=$(date +%s)
  mkdir -p "$WORK/etcd" && cd "$WORK/etcd"
  printf 'module modelpack.local/etcdbuild\ngo 1.25\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > go.mod
  printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' > main.go
  go build -ldflags "-s -w" -o "$OUT/etcd" .
  built etcd "$ETCD_VERSION" "$t0"
fi

for c in containerd containerd-shim-runc-v2 ctr; do
  want containerd || break
  fresh "$c" "$CONTAINERD_VERSION" && continue
  t0=$(date +%s)
  (cd "$WORK" && GOBIN=$OUT go install -ldflags "-s -w" "github.com/containerd/containerd/v2/cmd/$c@$CONTAINERD_VERSION")
  built "$c" "$CONTAINERD_VERSION" "$t0"
done

# Kubernetes: k8s.io/kubernetes replaces its staging modules with ./staging paths, which a dependent cannot use;
# the wrapper module maps each of them to the published k8s.io/X at the matching v0 version.
k8s=(kubectl kubelet kube-scheduler kube-controller-manager kube-apiserver)
need=()
want kubernetes && for c in "${k8s[@]}"; do fresh "$c" "$K8S_VERSION" || need+=("$c"); done
if [ ${#need[@]} -gt 0 ]; then
  staging=v0.${K8S_VERSION#v1.}
  mkdir -p "$WORK/kubernetes" && cd "$WORK/kubernetes"
  kdir=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  {
    echo "module modelpack.local/k8sbuild"
    echo "go 1.26.0"
    echo "godebug default=go1.26"
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo "replace ("
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$staging"'#p' "$kdir/go.mod"
    echo ")"
  } > go.mod
  echo 'package k8sbuild' > doc.go
  ver="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
  ver="$ver -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X k8s.io/component-base/version.gitTreeState=clean"
  for c in "${need[@]}"; do
    t0=$(date +%s)
    go build -ldflags "-s -w $ver" -o "$OUT/$c" "k8s.io/kubernetes/cmd/$c"
    built "$c" "$K8S_VERSION" "$t0"
  done
fi

