#!/usr/bin/env bash
# Prepull benchmark. Expects MODEL_DIR (the 2 GiB model), WORK (scratch space), REGISTRY (host:port of a
# plain-HTTP registry) and REF (the model pushed there; pushed here if unset). Needs root (mounts).
#
# Prepull throughput of the 2 GiB model vs a cold publish of it, each on an empty node cache of a fresh driver:
# a prepull must move the model as fast as a pod's first mount does (target: within 10%). Rounds alternate
# which goes first so drift on a shared machine hits both alike; medians of PREPULL_N rounds (default 5).
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

: "${MODEL_DIR:?MODEL_DIR is the benchmark model directory}"
: "${WORK:?WORK is a scratch directory}"
: "${REGISTRY:?REGISTRY is host:port of a plain-HTTP registry}"
[ "$(id -u)" = 0 ] || { echo "bench-prepull: needs root for mounts" >&2; exit 1; }
N=${PREPULL_N:-5}
D=$WORK/prepull
bench_scratch "$D"
bench_model "$D"
bytes=$(curl -fsS -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$REGISTRY/v2/$repo/manifests/$tag" |
  python3 -c 'import json,sys; m=json.load(sys.stdin); print(m["config"]["size"]+sum(l["size"] for l in m["layers"]))')
go build -o "$D/csiclient" ./e2e/cmd/csiclient

DRIVER_PID=
ROOT_DIR=
start_driver() { # fresh driver on an empty cache under $D/$1
  ROOT_DIR=$D/$1
  rm -rf "$ROOT_DIR"
  mkdir -p "$ROOT_DIR"
  local metrics=127.0.0.1:$(free_port)
  modelpack csi-driver --endpoint "unix://$ROOT_DIR/csi.sock" --node-id bench --root "$ROOT_DIR" --metrics-addr "$metrics" \
    --registry-config "$DOCKER_CONFIG/config.json" --plain-http-registries "$REGISTRY" --log-level warn \
    2>"$ROOT_DIR/driver.log" &
  DRIVER_PID=$!
  for _ in $(seq 200); do
    curl -fsS "http://$metrics/healthz" >/dev/null 2>&1 && [ -S "$ROOT_DIR/prepull.sock" ] && return 0
    sleep 0.05
  done
  echo "driver did not start:" >&2; cat "$ROOT_DIR/driver.log" >&2; return 1
}
stop_driver() {
  [ -n "$DRIVER_PID" ] || return 0
  for m in $(awk -v d="$ROOT_DIR/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r); do umount -l "$m" 2>/dev/null || true; done
  kill "$DRIVER_PID" 2>/dev/null || true
  wait "$DRIVER_PID" 2>/dev/null || true
  DRIVER_PID=
  rm -rf "$ROOT_DIR"
}
trap stop_driver EXIT

# Each run is a subshell (its output is the time), so each cleans up after itself.
cold_publish() {
  trap stop_driver EXIT
  start_driver publish
  mkdir -p "$ROOT_DIR/pod"
  timed "$D/csiclient" -endpoint "unix://$ROOT_DIR/csi.sock" publish -volume-id vol-bench -target "$ROOT_DIR/pod/mount" \
    -attr "reference=$REF" -timeout 2m
  test -s "$ROOT_DIR/pod/mount/$(ls "$MODEL_DIR" | grep safetensors | head -1)" || { echo "the publish mounted no weights" >&2; exit 1; }
  stop_driver
}
prepull() {
  trap stop_driver EXIT
  start_driver prepull
  timed modelpack prepull -q --socket "$ROOT_DIR/prepull.sock" "$REF"
  modelpack prepull status --socket "$ROOT_DIR/prepull.sock" | grep -q ready || { echo "the prepull is not ready" >&2; exit 1; }
  stop_driver
}

# Warm the registry's page cache so the first measured run is not penalised.
for d in $blobs; do
  curl -fsS -o /dev/null "http://$REGISTRY/v2/$repo/blobs/$d"
done

pub=() pre=()
for i in $(seq "$N"); do
  if (( i % 2 )); then
    pub+=("$(cold_publish)"); pre+=("$(prepull)")
  else
    pre+=("$(prepull)"); pub+=("$(cold_publish)")
  fi
done
t_pub=$(median "${pub[@]}")
t_pre=$(median "${pre[@]}")
mibs() { awk -v b="$bytes" -v t="$1" 'BEGIN{printf "%.0f", b/t/1048576}'; }
r=$(ratio "$t_pub" "$t_pre")
printf '%-44s %8ss  %5s MiB/s   (runs: %s)\n' "cold publish (2 GiB, empty cache)" "$t_pub" "$(mibs "$t_pub")" "${pub[*]}"
printf '%-44s %8ss  %5s MiB/s   (runs: %s)\n' "prepull (2 GiB, empty cache)" "$t_pre" "$(mibs "$t_pre")" "${pre[*]}"
printf '%-44s %8s×  (target 0.90–1.10)\n' "prepull throughput / cold publish" "$r"
cat > "$D/result.json" <<JSON
{"bytes": $bytes, "cold_publish_s": $t_pub, "prepull_s": $t_pre, "throughput_ratio": $r,
 "cold_publish_runs": [$(IFS=,; echo "${pub[*]}")], "prepull_runs": [$(IFS=,; echo "${pre[*]}")]}
JSON
if awk -v r="$r" 'BEGIN{exit !(r < 0.90)}'; then
  echo "MISSED: prepull moves the model slower than a cold publish (${r}×)"
elif awk -v r="$r" 'BEGIN{exit !(r > 1.10)}'; then
  echo "OUTSIDE 0.90–1.10 on the fast side: prepull is ${r}× as fast as a cold publish of the same bytes"
fi
