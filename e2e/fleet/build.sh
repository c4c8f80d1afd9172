#!/usr/bin/env bash
# Builds Uber Kraken's agent, origin, tracker and build-index at a pinned version into bin/kraken, and installs
# nginx-light (every Kraken component execs /usr/sbin/nginx) when it is missing. A binary already built at the
# pinned version is kept (bin/kraken/.versions).
# Why not `go install github.com/uber/kraken/agent@VERSION`: Kraken's go.mod has replace directives, which
# `go install pkg@version` refuses. `go mod download` of the exact version works, and building inside a writable
# copy of it honours the replaces and the shipped go.sum.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KRAKEN_VERSION=${KRAKEN_VERSION:-v0.1.27}
OUT=${KRAKEN_BIN:-$ROOT/bin/kraken}
WORK=$OUT/.build
export GOWORK=off CGO_ENABLED=${CGO_ENABLED:-1}   # origin and build-index keep their state in sqlite (cgo)
mkdir -p "$OUT"
touch "$OUT/.versions"

have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
if ! have nginx-light && [ ! -x /usr/sbin/nginx ]; then
  echo "installing nginx-light"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nginx-light >/dev/null
fi

parts=(agent origin tracker build-index)
fresh() { [ -x "$OUT/$1" ] && grep -qx "$1 $2" "$OUT/.versions"; }
need=()
for p in "${parts[@]}"; do fresh "$p" "$KRAKEN_VERSION" || need+=("$p"); done
[ ${#need[@]} -eq 0 ] && exit 0

t0=$(date +%s)
dir=$(cd /tmp && go mod download -json "github.com/uber/kraken@$KRAKEN_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
[ -d "$dir" ] || { echo "go mod download github.com/uber/kraken@$KRAKEN_VERSION failed" >&2; exit 1; }
src=$WORK/kraken-$KRAKEN_VERSION
rm -rf "$src"; mkdir -p "$WORK"; cp -r "$dir" "$src"; chmod -R u+w "$src"   # the module cache is read-only
pkgs=(); for p in "${need[@]}"; do pkgs+=("./$p"); done
(cd "$src" && go build -trimpath -o "$OUT/" "${pkgs[@]}")
for p in "${need[@]}"; do sed -i "/^$p /d" "$OUT/.versions"; echo "$p $KRAKEN_VERSION" >> "$OUT/.versions"; done
rm -rf "$src"
echo "built kraken ${need[*]} $KRAKEN_VERSION in $(( $(date +%s) - t0 )) s"
