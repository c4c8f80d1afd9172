#!/usr/bin/env bash
# CSI driver benchmark. Expects MODEL_DIR (the 2 GiB model), WORK (scratch space), REGISTRY (host:port of a
# plain-HTTP registry) and REF (the model pushed there; pushed here if unset). Needs root (mounts).
#
#  - cold publish: NodePublishVolume of the 2 GiB model on a fresh driver with an empty node cache, until the mount is
#    usable, side by side with a parallel curl of its blobs (target ≤ 1.15×) and with "download at pod start" (oras
#    pull into a dir, target: ≥ 1.3× the cold publish), medians of RUNS (5) interleaved rounds;
#  - peak RSS of the driver during that cold publish (VmHWM);
#  - warm publish p50/p99, each publish a new pod's target, for a 10 MiB model and the 2 GiB one (target ≈ equal,
#    p50 ≤ 20 ms).
# BENCH_BASELINE_BIN=/path/to/an/older/modelpack adds its cold publish to every round (before/after in one run).
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

: "${MODEL_DIR:?MODEL_DIR is the benchmark model directory}"
: "${WORK:?WORK is a scratch directory}"
: "${REGISTRY:?REGISTRY is host:port of a plain-HTTP registry}"
[ "$(id -u)" = 0 ] || { echo "bench-driver: needs root for mounts" >&2; exit 1; }
WARM_N=${WARM_N:-200}
D=$WORK/driver
bench_scratch "$D"
bench_model "$D"
SMALL_DIR=$WORK/model-10m
if [ ! -f "$SMALL_DIR/.complete" ]; then
  rm -rf "$SMALL_DIR"
  go run ./internal/cmd/genmodel --shards 1 --shard-size 10MiB "$SMALL_DIR" >/dev/null
  touch "$SMALL_DIR/.complete"
fi
SMALL_REF=$REGISTRY/bench/model-10m:v1
MODELPACK_HOME=$D/seed modelpack pack "$SMALL_DIR" -t "$SMALL_REF" --push --plain-http -q >/dev/null

go build -o "$D/csiclient" ./e2e/cmd/csiclient
RUNS=${RUNS:-5}
# BENCH_BASELINE_BIN: another modelpack binary (say, the previous release) whose cold publish is measured in the
# same rounds, for a before/after figure.
BASELINE=${BENCH_BASELINE_BIN:-}

DRIVER_PID= DROOT= CSI=
start_driver() { # BIN ROOT: starts a driver on an empty root and waits until it answers
  DROOT=$2
  rm -rf "$DROOT"
  mkdir -p "$DROOT"
  CSI="$D/csiclient -endpoint unix://$DROOT/csi.sock"
  METRICS=127.0.0.1:$(free_port)
  "$1" csi-driver --endpoint "unix://$DROOT/csi.sock" --node-id bench --root "$DROOT" --metrics-addr "$METRICS" \
    --registry-config "$DOCKER_CONFIG/config.json" --plain-http-registries "$REGISTRY" --log-level "${DRIVER_LOG_LEVEL:-warn}" \
    2>"$D/driver.log" &
  DRIVER_PID=$!
  for _ in $(seq 200); do
    curl -fsS "http://$METRICS/healthz" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "driver did not start:" >&2; cat "$D/driver.log" >&2; return 1
}
stop_driver() { # unpublishes what it published, unmounts what is left under the scratch dir, stops it
  [ -n "$DRIVER_PID" ] || return 0
  local tgt m
  for tgt in "$D"/pods/*/mount; do [ -e "$tgt" ] && $CSI unpublish -volume-id "vol-$(basename "$(dirname "$tgt")")" -target "$tgt" 2>/dev/null; done
  for m in $(awk -v d="$D/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r); do umount -l "$m" 2>/dev/null || true; done
  kill "$DRIVER_PID" 2>/dev/null || true
  wait "$DRIVER_PID" 2>/dev/null || true
  DRIVER_PID=
  rm -rf "$D/pods"
}
trap stop_driver EXIT

nblobs=$(echo "$blobs" | wc -l)
curl_pull() {
  rm -rf "$D/curl"; mkdir -p "$D/curl"
  echo "$blobs" | xargs -P "$nblobs" -I{} curl -fsS -o "$D/curl/{}" "http://$REGISTRY/v2/$repo/blobs/{}"
}
oras_pull() { rm -rf "$D/oras"; oras pull --plain-http -o "$D/oras" "$REF" >/dev/null; }
publish() { # POD REF: publishes REF into the pod's target (retrying ABORTED as kubelet does)
  mkdir -p "$D/pods/$1"
  $CSI publish -volume-id "vol-$1" -target "$D/pods/$1/mount" -attr "reference=$2" -timeout 2m
}

curl_pull >/dev/null 2>&1 # warm the registry's page cache so the first measured run is not penalised
# A cold publish on a fresh driver and an empty cache: BIN NAME prints seconds; the driver's peak RSS goes to
# $D/rss-NAME.
cold_publish() {
  trap stop_driver EXIT # a command substitution does not inherit the script's trap
  start_driver "$1" "$D/root-$2" >&2
  local t
  t=$(timed publish "cold-$2" "$REF")
  awk '/^VmHWM/ {print $2}' "/proc/$DRIVER_PID/status" > "$D/rss-$2"
  test -s "$D/pods/cold-$2/mount/$(ls "$MODEL_DIR" | grep safetensors | head -1)" || { echo "cold publish mounted no weights" >&2; exit 1; }
  stop_driver >&2
  rm -rf "$D/root-$2"
  sync # let the deletion and its discards settle before the next measurement
  echo "$t"
}
# Interleave the paths round by round so drift on a shared machine hits them alike, rotating their order (see
# rotate in lib.sh).
curl_runs=() cold_runs=() oras_runs=() base_runs=() rss_max=0
run_curl() { sync; curl_runs+=("$(timed curl_pull)"); rm -rf "$D/curl"; sync; }
run_cold() {
  cold_runs+=("$(cold_publish "$(command -v modelpack)" "$i")")
  rss_max=$(( $(cat "$D/rss-$i") > rss_max ? $(cat "$D/rss-$i") : rss_max ))
}
run_oras() { oras_runs+=("$(timed oras_pull)"); rm -rf "$D/oras"; sync; }
run_base() { base_runs+=("$(cold_publish "$BASELINE" "base-$i")"); }
paths=(run_curl run_cold run_oras)
if [ -n "$BASELINE" ]; then paths+=(run_base); fi
for i in $(seq "$RUNS"); do rotate "$i" "${paths[@]}"; done
t_curl=$(median "${curl_runs[@]}")
t_cold=$(median "${cold_runs[@]}")
t_oras=$(median "${oras_runs[@]}")
rss_kib=$rss_max

start_driver "$(command -v modelpack)" "$D/root"
publish big "$REF" >/dev/null 2>&1 # the warm figures start from a cache holding both models
publish small "$SMALL_REF" >/dev/null 2>&1
warm_big=$($CSI bench -attr "reference=$REF" -dir "$D/warm-big" -n "$WARM_N")
warm_small=$($CSI bench -attr "reference=$SMALL_REF" -dir "$D/warm-small" -n "$WARM_N")
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }

echo "driver ($(du -sh "$MODEL_DIR" | cut -f1) model, medians of $RUNS interleaved rounds: ${curl_runs[*]} / ${cold_runs[*]} / ${oras_runs[*]})"
printf '%-44s %8ss\n' "parallel curl of the $nblobs blobs" "$t_curl"
printf '%-44s %8ss   %s× curl (target ≤ 1.15×)\n' "cold publish (2 GiB, empty cache)" "$t_cold" "$(ratio "$t_cold" "$t_curl")"
printf '%-44s %8ss   oras is %s× the cold publish (target ≥ 1.3×)\n' "oras pull into a dir (download at pod start)" "$t_oras" "$(ratio "$t_oras" "$t_cold")"
if [ -n "$BASELINE" ]; then
  t_base=$(median "${base_runs[@]}")
  printf '%-44s %8ss   %s× curl (runs: %s)\n' "cold publish, baseline $(basename "$(dirname "$BASELINE")")" "$t_base" "$(ratio "$t_base" "$t_curl")" "${base_runs[*]}"
fi
printf '%-44s %8s MiB\n' "driver peak RSS during the cold publish" "$((rss_kib / 1024))"
printf '%-44s p50 %6s ms  p99 %6s ms  (n=%s)\n' "warm publish, 10 MiB model" "$(field "$warm_small" p50_ms)" "$(field "$warm_small" p99_ms)" "$WARM_N"
printf '%-44s p50 %6s ms  p99 %6s ms  (n=%s; target p50 ≤ 20 ms, ≈ the 10 MiB figure)\n' "warm publish, 2 GiB model" "$(field "$warm_big" p50_ms)" "$(field "$warm_big" p99_ms)" "$WARM_N"
cat > "$D/result.json" <<JSON
{"curl_s": $t_curl, "cold_publish_s": $t_cold, "oras_pull_s": $t_oras, "driver_peak_rss_kib": $rss_kib,
 "warm_10m": $warm_small, "warm_2g": $warm_big}
JSON
