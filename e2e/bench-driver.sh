#!/usr/bin/env bash
# CSI driver benchmark. Expects MODEL_DIR (the 2 GiB model), WORK (scratch space), REGISTRY (host:port of a
# plain-HTTP registry) and REF (the model pushed there; pushed here if unset). Needs root (mounts).
#
#  - cold publish: NodePublishVolume of the 2 GiB model on an empty node cache, until the mount is usable, side by
#    side with a parallel curl of its blobs (target ≤ 1.25×) and with "download at pod start" (oras pull into a dir);
#  - peak RSS of the driver during that cold publish (VmHWM);
#  - warm publish p50/p99, each publish a new pod's target, for a 10 MiB model and the 2 GiB one (target ≈ equal,
#    p50 ≤ 20 ms).
# Cold runs are single samples (2 GiB each); the peers run right before and after so drift hits them alike.
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
CSI="$D/csiclient -endpoint unix://$D/root/csi.sock"

METRICS=127.0.0.1:$(free_port)
modelpack csi-driver --endpoint "unix://$D/root/csi.sock" --node-id bench --root "$D/root" --metrics-addr "$METRICS" \
  --registry-config "$DOCKER_CONFIG/config.json" --plain-http-registries "$REGISTRY" --log-level "${DRIVER_LOG_LEVEL:-warn}" \
  2>"$D/driver.log" &
DRIVER_PID=$!
cleanup() {
  for t in "$D"/pods/*/mount; do [ -e "$t" ] && $CSI unpublish -volume-id "vol-$(basename "$(dirname "$t")")" -target "$t" 2>/dev/null; done
  for m in $(awk -v d="$D/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r); do umount -l "$m" 2>/dev/null || true; done
  kill "$DRIVER_PID" 2>/dev/null || true
  wait "$DRIVER_PID" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 200); do
  curl -fsS "http://$METRICS/healthz" >/dev/null 2>&1 && break
  sleep 0.05
done
curl -fsS "http://$METRICS/healthz" >/dev/null || { echo "driver did not start:" >&2; cat "$D/driver.log" >&2; exit 1; }

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
t_curl=$(timed curl_pull)
rm -rf "$D/curl"
t_cold=$(timed publish cold "$REF")
rss_kib=$(awk '/^VmHWM/ {print $2}' "/proc/$DRIVER_PID/status")
test -s "$D/pods/cold/mount/$(ls "$MODEL_DIR" | grep safetensors | head -1)" || { echo "cold publish mounted no weights" >&2; exit 1; }
t_oras=$(timed oras_pull)
rm -rf "$D/oras"
publish small "$SMALL_REF" 2>/dev/null

warm_big=$($CSI bench -attr "reference=$REF" -dir "$D/warm-big" -n "$WARM_N")
warm_small=$($CSI bench -attr "reference=$SMALL_REF" -dir "$D/warm-small" -n "$WARM_N")
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }

printf '%-44s %8ss\n' "parallel curl of the $nblobs blobs" "$t_curl"
printf '%-44s %8ss   %s× curl (target ≤ 1.25×)\n' "cold publish (2 GiB, empty cache)" "$t_cold" "$(ratio "$t_cold" "$t_curl")"
printf '%-44s %8ss   cold publish is %s× oras pull\n' "oras pull into a dir (download at pod start)" "$t_oras" "$(ratio "$t_cold" "$t_oras")"
printf '%-44s %8s MiB\n' "driver peak RSS during the cold publish" "$((rss_kib / 1024))"
printf '%-44s p50 %6s ms  p99 %6s ms  (n=%s)\n' "warm publish, 10 MiB model" "$(field "$warm_small" p50_ms)" "$(field "$warm_small" p99_ms)" "$WARM_N"
printf '%-44s p50 %6s ms  p99 %6s ms  (n=%s; target p50 ≤ 20 ms, ≈ the 10 MiB figure)\n' "warm publish, 2 GiB model" "$(field "$warm_big" p50_ms)" "$(field "$warm_big" p99_ms)" "$WARM_N"
cat > "$D/result.json" <<JSON
{"curl_s": $t_curl, "cold_publish_s": $t_cold, "oras_pull_s": $t_oras, "driver_peak_rss_kib": $rss_kib,
 "warm_10m": $warm_small, "warm_2g": $warm_big}
JSON
