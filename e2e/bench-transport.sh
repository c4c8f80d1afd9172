#!/usr/bin/env bash
# Transport benchmark: modelpack pull/fetch/push against oras v1.3.6 and a plain parallel curl download, side by
# side on one registry, medians of RUNS (5). Expects MODEL_DIR (the 2 GiB model), WORK (scratch space), REGISTRY
# (host:port of a plain-HTTP registry) and REF (the model pushed there; pushed here if unset). Prints one line per
# figure with its ratio and target. Absolute times drift on shared machines: read the ratios.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

: "${MODEL_DIR:?MODEL_DIR is the benchmark model directory}"
: "${WORK:?WORK is a scratch directory}"
: "${REGISTRY:?REGISTRY is host:port of a plain-HTTP registry}"
RUNS=${RUNS:-5}
T=$WORK/transport
bench_scratch "$T"
bench_model "$T"
nblobs=$(echo "$blobs" | wc -l)

# BENCH_BASELINE_BIN: another modelpack binary whose pull and fetch are measured in the same rounds (before/after).
BASELINE=${BENCH_BASELINE_BIN:-}
# Each measurement starts from empty destinations and a settled disk: deleting 2 GiB (and its discards) is not
# part of any tool's time.
fresh() { rm -rf "$T/home" "$T/fetch" "$T/oras" "$T/curl"; sync; }
mp_pull() { "${1:-modelpack}" --home "$T/home" pull --plain-http -q "$REF"; }
mp_fetch() { "${1:-modelpack}" fetch --plain-http -q "$REF" "$T/fetch"; }
oras_pull() { oras pull --plain-http -o "$T/oras" "$REF" >/dev/null; }
curl_pull() {
  mkdir -p "$T/curl"
  echo "$blobs" | xargs -P "$nblobs" -I{} curl -fsS -o "$T/curl/{}" "http://$REGISTRY/v2/$repo/blobs/{}"
}

# The same download made durable: what waiting for the disk costs (modelpack pull names verified blobs at once and
# flushes them in the background, marking each durable when its flush completed).
curl_sync_pull() { curl_pull; sync "$T"/curl/*; }

declare -A times

# Interleave the tools run by run so drift on a shared machine hits them alike, rotating their order (see rotate in
# lib.sh).
pull_runs=() fetch_runs=() oras_runs=() curl_runs=() curls_runs=() bpull_runs=() bfetch_runs=()
run_pull() { fresh; pull_runs+=("$(timed mp_pull)"); }
run_fetch() { fresh; fetch_runs+=("$(timed mp_fetch)"); }
run_oras() { fresh; oras_runs+=("$(timed oras_pull)"); }
run_curl() { fresh; curl_runs+=("$(timed curl_pull)"); }
run_curls() { fresh; curls_runs+=("$(timed curl_sync_pull)"); }
run_bpull() { fresh; bpull_runs+=("$(timed mp_pull "$BASELINE")"); }
run_bfetch() { fresh; bfetch_runs+=("$(timed mp_fetch "$BASELINE")"); }
tools=(run_pull run_fetch run_oras run_curl run_curls)
if [ -n "$BASELINE" ]; then tools+=(run_bpull run_bfetch); fi
for i in $(seq "$RUNS"); do rotate "$i" "${tools[@]}"; done
times[pull]=$(median "${pull_runs[@]}")
times[fetch]=$(median "${fetch_runs[@]}")
times[oras]=$(median "${oras_runs[@]}")
times[curl]=$(median "${curl_runs[@]}")
times[curlsync]=$(median "${curls_runs[@]}")
rm -rf "$T/fetch" "$T/oras" "$T/curl"

# Pushes: modelpack from its store (packed once, not timed) vs oras from the directory, each run to a new
# repository so every blob is uploaded.
MODELPACK_HOME=$T/store modelpack pack "$MODEL_DIR" -t bench/push:v1 -q >/dev/null
files=()
while IFS= read -r f; do
  case "$f" in
    *.safetensors) files+=("$f:application/vnd.cncf.model.weight.v1.raw") ;;
    *) files+=("$f:application/vnd.cncf.model.weight.config.v1.raw") ;;
  esac
done < <(cd "$MODEL_DIR" && find . -type f ! -name '.complete' -printf '%P\n' | sort)
oras_push() { oras push "$@" >/dev/null; }
push_runs=() orasp_runs=()
for i in $(seq "$RUNS"); do
  push_runs+=("$(timed env MODELPACK_HOME="$T/store" modelpack push --plain-http -q --from bench/push:v1 "$REGISTRY/bench/mp-push-$i:v1")")
  orasp_runs+=("$(cd "$MODEL_DIR" && timed oras_push --plain-http --artifact-type application/vnd.cncf.model.manifest.v1+json "$REGISTRY/bench/oras-push-$i:v1" "${files[@]}")")
done
times[push]=$(median "${push_runs[@]}")
times[oraspush]=$(median "${orasp_runs[@]}")

# A repeated push sends no layer bytes.
resent=$(MODELPACK_HOME=$T/store modelpack push --plain-http -q -o json --from bench/push:v1 "$REGISTRY/bench/mp-push-1:v1" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["transferredBytes"])')

# Peak RSS of a pull.
rm -rf "$T/home"
rss=$(peak_rss_mib modelpack --home "$T/home" pull --plain-http -q "$REF")
rm -rf "$T/home" "$T/store"

verdict() { awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN{ok = (op==">=") ? (v>=t) : (v<=t); print ok ? "PASS" : "MISS"}'; }
line() { # LABEL DETAIL VALUE OP TARGET UNIT
  printf '%-34s %-44s %8s  target %s %s%s  %s\n' "$1" "$2" "$3$6" "$4" "$5" "$6" "$(verdict "$3" "$4" "$5")"
}
r1=$(ratio "${times[oras]}" "${times[pull]}")
r2=$(ratio "${times[oras]}" "${times[fetch]}")
r3=$(ratio "${times[pull]}" "${times[curl]}")
r4=$(ratio "${times[oraspush]}" "${times[push]}")
r5=$(ratio "${times[pull]}" "${times[curlsync]}")
echo "transport ($(du -sh "$MODEL_DIR" | cut -f1) model, medians of $RUNS; ratios > 1 mean modelpack is faster unless noted)"
line "pull vs oras pull" "modelpack ${times[pull]}s, oras ${times[oras]}s" "$r1" ">=" 1.3 "x"
line "fetch vs oras pull" "modelpack ${times[fetch]}s, oras ${times[oras]}s" "$r2" ">=" 1.3 "x"
line "pull / parallel curl (lower is better)" "modelpack ${times[pull]}s, curl ${times[curl]}s" "$r3" "<=" 1.2 "x"
line "fetch / parallel curl (lower is better)" "modelpack ${times[fetch]}s, curl ${times[curl]}s" "$(ratio "${times[fetch]}" "${times[curl]}")" "<=" 1.2 "x"
line "pull / (parallel curl + fsync)" "modelpack ${times[pull]}s, curl+fsync ${times[curlsync]}s" "$r5" "<=" 1.25 "x"
line "push vs oras push" "modelpack ${times[push]}s, oras ${times[oraspush]}s" "$r4" ">=" 1.2 "x"
line "peak RSS during pull" "modelpack pull" "$rss" "<=" 64 " MiB"
if [ -n "$BASELINE" ]; then
  bp=$(median "${bpull_runs[@]}") bf=$(median "${bfetch_runs[@]}")
  echo "baseline $BASELINE: pull ${bp}s ($(ratio "$bp" "${times[curl]}")× curl; runs ${bpull_runs[*]}), fetch ${bf}s ($(ratio "$bf" "${times[curl]}")× curl)"
fi
echo "runs: pull ${pull_runs[*]} | fetch ${fetch_runs[*]} | oras ${oras_runs[*]} | curl ${curl_runs[*]}"
line "layer bytes resent by a repeated push" "modelpack push, same model twice" "$resent" "<=" 0 " B"
