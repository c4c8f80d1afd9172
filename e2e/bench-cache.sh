#!/usr/bin/env bash
# Node cache benchmark: cold pull + view of the benchmark model against a plain parallel curl of its blobs, warm
# view assembly for a 10 MiB and the 2 GiB model, view assembly for a 1,000-file model, and the bytes a new model
# version costs when one shard changed. Expects MODEL_DIR (the 2 GiB model), WORK (scratch space), REGISTRY
# (host:port of a plain-HTTP registry) and REF (the model pushed there; pushed here if unset). Prints one line per
# figure with its ratio and target. Absolute times drift on shared machines: read the ratios.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

: "${MODEL_DIR:?MODEL_DIR is the benchmark model directory}"
: "${WORK:?WORK is a scratch directory}"
: "${REGISTRY:?REGISTRY is host:port of a plain-HTTP registry}"
RUNS=${RUNS:-5}
C=$WORK/cache
rm -rf "$C"
mkdir -p "$C"

push() { # DIR REF
  MODELPACK_HOME=$C/seed modelpack pack "$1" -t "$2" --push --plain-http -q >/dev/null
}
REF=${REF:-$REGISTRY/bench/model:v1}
if ! curl -fsS -o /dev/null -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$REGISTRY/v2/$(echo "${REF#*/}" | sed 's/:/\/manifests\//')" 2>/dev/null; then
  push "$MODEL_DIR" "$REF"
fi

# manifest REF: the manifest JSON of a tag.
manifest() {
  local rt=${1#*/}
  curl -fsS -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$REGISTRY/v2/${rt%:*}/manifests/${rt##*:}"
}
repo_tag=${REF#*/}
repo=${repo_tag%:*}
blobs=$(manifest "$REF" | python3 -c 'import json,sys; m=json.load(sys.stdin); print("\n".join([m["config"]["digest"]]+[l["digest"] for l in m["layers"]]))')
nblobs=$(echo "$blobs" | wc -l)

# Deleting the previous run's 2 GiB is not part of any timing (with discard mounts it takes seconds).
curl_prep() { rm -rf "$C/curl"; mkdir -p "$C/curl"; }
curl_pull() { echo "$blobs" | xargs -P "$nblobs" -I{} curl -fsS -o "$C/curl/{}" "http://$REGISTRY/v2/$repo/blobs/{}"; }
# The same download made durable before it is used (the cache uses verified blobs at once and makes them durable in
# the background, see cas/durable.go).
curl_sync_pull() { curl_pull; sync "$C"/curl/*; }
# A cold pull into an empty cache root, then the first view: what a node does for the first pod of a model. The
# figure is the command's own clock around Pull and Acquire: its exit waits for the background flush (a driver
# stopping does too), which no pod waits for.
mp_cold() {
  modelpack cache bench --root "$C/root" --plain-http -o json --rounds 1 "$REF" >"$C/cold.json"
  python3 -c 'import json,sys; print("%.3f" % json.load(open(sys.argv[1]))["coldSeconds"])' "$C/cold.json"
}
# warm ROOT REF OUT: view figures for a model already in ROOT (the Pull is a cache hit).
warm() { modelpack cache bench --root "$1" --plain-http -o json --rounds 9 "$2" >"$3"; }
json() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }
ms() { awk -v s="$1" 'BEGIN{printf "%.2f", s*1000}'; }

# Interleave the runs so drift on a shared machine hits them alike, rotating their order (see rotate in lib.sh).
curl_runs=() curls_runs=() cold_runs=()
run_curl() { curl_prep; curl_runs+=("$(timed curl_pull)"); }
run_curls() { curl_prep; curls_runs+=("$(timed curl_sync_pull)"); }
run_cold() { rm -rf "$C/root"; sync; cold_runs+=("$(mp_cold)"); }
for i in $(seq "$RUNS"); do rotate "$i" run_curl run_curls run_cold; done
rm -rf "$C/curl"
t_curl=$(median "${curl_runs[@]}")
t_curls=$(median "${curls_runs[@]}")
t_cold=$(median "${cold_runs[@]}")
warm "$C/root" "$REF" "$C/big.json"
big_assemble=$(json "$C/big.json" assembleSeconds)
big_acquire=$(json "$C/big.json" newVolumeSeconds)
big_files=$(json "$C/big.json" files)
big_files=$(json "$C/cold.json" files)

# A 10 MiB model (4 shards of 2.5 MiB) and a 1,000-file model, each pulled into a fresh root.
go run ./internal/cmd/genmodel --shards 4 --shard-size 2560KiB "$C/small" >/dev/null
push "$C/small" "$REGISTRY/bench/small:v1"
modelpack cache bench --root "$C/small-root" --plain-http -o json --rounds 1 "$REGISTRY/bench/small:v1" >/dev/null
warm "$C/small-root" "$REGISTRY/bench/small:v1" "$C/small.json"
go run ./internal/cmd/genmodel --shards 1 --shard-size 1MiB --files 1000 "$C/many" >/dev/null
push "$C/many" "$REGISTRY/bench/many:v1"
modelpack cache bench --root "$C/many-root" --plain-http -o json --rounds 9 "$REGISTRY/bench/many:v1" >"$C/many.json"
small_assemble=$(json "$C/small.json" assembleSeconds)
small_acquire=$(json "$C/small.json" newVolumeSeconds)
many_assemble=$(json "$C/many.json" assembleSeconds)
many_files=$(json "$C/many.json" files)

# A new version of the 2 GiB model whose last shard changed: pulled into the root that holds the first version.
mkdir -p "$C/changed"
cp -al "$MODEL_DIR"/. "$C/changed/"
rm -f "$C/changed/.complete"
last=$(cd "$C/changed" && ls model-*.safetensors | sort | tail -1)
go run ./internal/cmd/genmodel --shards 1 --shard-size "$(stat -c %s "$C/changed/$last")B" --seed 9999 "$C/newshard" >/dev/null
rm -f "$C/changed/$last"
mv "$C/newshard/model-00001-of-00001.safetensors" "$C/changed/$last"
rm -rf "$C/newshard"
push "$C/changed" "$REGISTRY/bench/model:v2"
changed=$(python3 - "$(manifest "$REF")" "$(manifest "$REGISTRY/bench/model:v2")" <<'PY'
import json, sys
old, new = json.loads(sys.argv[1]), json.loads(sys.argv[2])
have = {d["digest"] for d in [old["config"]] + old["layers"]}
print(sum(d["size"] for d in [new["config"]] + new["layers"] if d["digest"] not in have))
PY
)
modelpack cache bench --root "$C/root" --plain-http -o json --rounds 1 "$REGISTRY/bench/model:v2" >"$C/changed.json"
moved=$(json "$C/changed.json" blobBytes)
rm -rf "$C/changed" "$C/root" "$C/small-root" "$C/many-root"

echo "cache (medians of $RUNS interleaved rounds: curl ${curl_runs[*]} / curl+sync ${curls_runs[*]} / cold ${cold_runs[*]})"
printf '%-44s %8.2f s vs parallel curl %6.2f s  %5.2fx  (target <= 1.25x)\n' "cold pull + view, 2 GiB model:" "$t_cold" "$t_curl" "$(ratio "$t_cold" "$t_curl")"
printf '%-44s %8.2f s vs curl + sync    %6.2f s  %5.2fx  (curl made durable before use)\n' "" "$t_cold" "$t_curls" "$(ratio "$t_cold" "$t_curls")"
printf '%-44s %8s ms (10 MiB) vs %6s ms (2 GiB)  %5.2fx  (target ~1x, both < 20 ms)\n' "warm view assembly, new model version:" "$(ms "$small_assemble")" "$(ms "$big_assemble")" "$(ratio "$big_assemble" "$small_assemble")"
printf '%-44s %8s ms (10 MiB) vs %6s ms (2 GiB)  %5.2fx  (target ~1x, both < 20 ms)\n' "warm view for a new volume (view shared):" "$(ms "$small_acquire")" "$(ms "$big_acquire")" "$(ratio "$big_acquire" "$small_acquire")"
printf '%-44s %8s ms for %d files (%s files in the 2 GiB model)\n' "view assembly, 1,000-file model:" "$(ms "$many_assemble")" "$many_files" "$big_files"
printf '%-44s %8d bytes for %d changed  %7.4fx  (target <= 1.01x)\n' "changed-shard pull, bytes transferred:" "$moved" "$changed" "$(awk -v a="$moved" -v b="$changed" 'BEGIN{printf "%.4f", a/b}')"
