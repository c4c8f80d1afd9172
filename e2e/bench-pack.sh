#!/usr/bin/env bash
# Pack benchmark: `modelpack pack` against `oras push --oci-layout` of the same model directory, side by side in
# one run, medians of 3 (runs alternate which tool goes first, so neither always gets the warmer page cache).
# Each run writes into a fresh store. Prints one line: times, ratio and modelpack's peak RSS, with the targets.
# modelpack fsyncs every blob before it writes the tag (an interrupted pack never leaves a tag to missing data);
# oras leaves its blobs in the page cache. A second line therefore also times oras followed by an fsync of the
# blobs it wrote (coreutils `sync FILE...`), the same durability, so the cost of the guarantee is visible, and a
# third line compares CPU time (user+sys), which a busy shared machine disturbs far less than wall time.
# Needs MODEL_DIR (the generated benchmark model) and WORK (scratch dir); `make bench` sets both.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
: "${MODEL_DIR:?MODEL_DIR must name the model directory}" "${WORK:?WORK must name a scratch directory}"
RUNS=${RUNS:-3}
MODELPACK=${MODELPACK:-modelpack}
ORAS=${ORAS:-oras}
scratch=$WORK/bench-pack
rm -rf "$scratch"
mkdir -p "$scratch"
trap 'rm -rf "$scratch"' EXIT

# oras is given the same top-level entries modelpack packs (hidden ones are skipped by both).
mapfile -t entries < <(cd "$MODEL_DIR" && find . -mindepth 1 -maxdepth 1 ! -name '.*' -printf '%P\n' | sort)

run_modelpack() {
  local home=$scratch/home
  rm -rf "$home"
  /usr/bin/time -f '%e %M %U %S' -o "$scratch/time" env MODELPACK_HOME="$home" "$MODELPACK" pack "$MODEL_DIR" -t bench/model:v1 -q >/dev/null
  read -r secs kib user sys <"$scratch/time"
  mp_times+=("$secs")
  mp_rss+=("$((kib / 1024))")
  mp_cpu+=("$(awk -v u="$user" -v s="$sys" 'BEGIN{printf "%.2f", u+s}')")
  rm -rf "$home"
}

run_oras() {
  local layout=$scratch/oras-layout
  rm -rf "$layout"
  local push flush user sys
  (cd "$MODEL_DIR" && /usr/bin/time -f '%e %U %S' -o "$scratch/time" "$ORAS" push --oci-layout "$layout:v1" "${entries[@]}" >/dev/null 2>&1)
  read -r push user sys <"$scratch/time"
  oras_cpu+=("$(awk -v u="$user" -v s="$sys" 'BEGIN{printf "%.2f", u+s}')")
  flush=$(timed sync "$layout"/blobs/sha256/* "$layout/index.json")
  oras_times+=("$push")
  oras_durable+=("$(awk -v a="$push" -v b="$flush" 'BEGIN{printf "%.3f", a+b}')")
  rm -rf "$layout"
}

mp_times=() mp_rss=() mp_cpu=() oras_times=() oras_durable=() oras_cpu=()
for i in $(seq "$RUNS"); do
  if ((i % 2)); then run_modelpack; run_oras; else run_oras; run_modelpack; fi
done

mp=$(median "${mp_times[@]}")
or=$(median "${oras_times[@]}")
rss=$(printf '%s\n' "${mp_rss[@]}" | sort -n | tail -1)
ord=$(median "${oras_durable[@]}")
ratio=$(awk -v a="$or" -v b="$mp" 'BEGIN{printf "%.2f", a/b}')
ratio_durable=$(awk -v a="$ord" -v b="$mp" 'BEGIN{printf "%.2f", a/b}')
echo "pack: modelpack ${mp}s oras ${or}s ratio ${ratio}x (target >=1.5x) rss ${rss}MiB (target <100MiB)"
echo "pack durable: modelpack ${mp}s oras+fsync ${ord}s ratio ${ratio_durable}x"
mpc=$(median "${mp_cpu[@]}")
orc=$(median "${oras_cpu[@]}")
echo "pack cpu: modelpack ${mpc}s oras ${orc}s ratio $(awk -v a="$orc" -v b="$mpc" 'BEGIN{printf "%.2f", a/b}')x (user+sys: the work each does, whatever else the machine runs)"
echo "pack runs: modelpack ${mp_times[*]} s; oras ${oras_times[*]} s; oras+fsync ${oras_durable[*]} s; modelpack peak RSS ${mp_rss[*]} MiB"
