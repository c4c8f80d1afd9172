#!/usr/bin/env bash
# make bench: generates the 2 GiB benchmark model (4 × 512 MiB shards + small files) once, starts a real local
# registry, pushes the model, then runs each area's benchmark side by side with its peer and prints ratios.
# Absolute times drift on shared machines; read the ratios. BENCH_ONLY=pack,transport,... runs a subset.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

WORK=${BENCH_WORK:-/var/tmp/modelpack-bench}
mkdir -p "$WORK"
export WORK
MODEL_DIR=$WORK/model
if [ ! -f "$MODEL_DIR/.complete" ]; then
  rm -rf "$MODEL_DIR"
  echo "generating the 2 GiB benchmark model in $MODEL_DIR"
  go run ./internal/cmd/genmodel --shards 4 --shard-size 512MiB "$MODEL_DIR"
  touch "$MODEL_DIR/.complete"
fi
export MODEL_DIR

rm -rf "$WORK/registry"
start_registry "$WORK/registry"
trap 'kill $REGISTRY_PID 2>/dev/null || true' EXIT
export REF=$REGISTRY/bench/model:v1
MODELPACK_HOME=$WORK/home-seed modelpack pack "$MODEL_DIR" -t "$REF" --push --plain-http -q >/dev/null
echo "benchmark model pushed to $REF"
echo

for area in pack transport cache driver prepull cluster; do
  if [ -n "${BENCH_ONLY:-}" ] && [[ ",$BENCH_ONLY," != *",$area,"* ]]; then continue; fi
  echo "== $area"
  if [ "$area" = cluster ]; then
    # Its own cluster and registry (e2e/cluster); MODEL_DIR is the model above.
    go run -tags cluster ./e2e/cluster/bench
    echo
    continue
  fi
  script=e2e/bench-$area.sh
  [ -f "$script" ] || continue
  bash "$script"
  echo
done
