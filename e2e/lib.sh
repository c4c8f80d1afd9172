# Shared helpers for the e2e shell scripts (demo and benchmarks). Source it; it expects to run from the repo root.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PATH="$ROOT/bin/tools:$ROOT/bin:$PATH"

# free_port prints a free TCP port on 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_registry DIR: runs a real distribution registry with filesystem storage under DIR on a free port,
# exports REGISTRY=127.0.0.1:PORT and REGISTRY_PID, and waits until it answers.
start_registry() {
  local dir=$1 port
  port=$(free_port)
  mkdir -p "$dir/data"
  cat > "$dir/config.yml" <<YAML
version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
YAML
  OTEL_TRACES_EXPORTER=none registry serve "$dir/config.yml" >"$dir/registry.log" 2>&1 &
  REGISTRY_PID=$!
  REGISTRY=127.0.0.1:$port
  export REGISTRY REGISTRY_PID
  for _ in $(seq 100); do
    curl -fsS "http://$REGISTRY/v2/" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "registry did not start:" >&2; cat "$dir/registry.log" >&2; return 1
}

# median prints the median of its numeric arguments.
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# timed CMD...: runs CMD, prints elapsed seconds (to 3 decimals) on stdout; CMD's output goes to stderr.
timed() {
  local s e
  s=$(date +%s.%N)
  "$@" >&2
  e=$(date +%s.%N)
  awk -v s="$s" -v e="$e" 'BEGIN{printf "%.3f\n", e-s}'
}

# peak_rss_mib CMD...: runs CMD under /usr/bin/time-like accounting and prints its peak RSS in MiB.
peak_rss_mib() {
  python3 - "$@" <<'PY'
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
PY
}

# ratio A B: prints A/B to 2 decimals.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }

# drop_caches: makes "cold" mean cold disk too, where permitted.
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }

# bench_scratch DIR: a fresh scratch directory with an empty docker config, so no tool finds stray credentials.
bench_scratch() {
  rm -rf "$1"
  mkdir -p "$1/docker"
  echo '{"auths":{}}' > "$1/docker/config.json"
  export DOCKER_CONFIG=$1/docker
}

# bench_model SCRATCH: defaults REF to the benchmark model, pushes it if the registry lacks it (a script run on its
# own), and sets repo, tag and blobs (the config and layer digests, one per line) for the curl baselines.
bench_model() {
  REF=${REF:-$REGISTRY/bench/model:v1}
  local rt=${REF#*/} accept='Accept: application/vnd.oci.image.manifest.v1+json'
  repo=${rt%:*}
  tag=${rt##*:}
  if ! curl -fsS -o /dev/null -H "$accept" "http://$REGISTRY/v2/$repo/manifests/$tag" 2>/dev/null; then
    MODELPACK_HOME=$1/seed modelpack pack "$MODEL_DIR" -t "$REF" --push --plain-http -q >/dev/null
  fi
  blobs=$(curl -fsS -H "$accept" "http://$REGISTRY/v2/$repo/manifests/$tag" |
    python3 -c 'import json,sys; m=json.load(sys.stdin); print("\n".join([m["config"]["digest"]]+[l["digest"] for l in m["layers"]]))')
}

# rotate ROUND FN...: runs the functions in turn, starting with the one at ROUND modulo their count. Benchmarks
# rotate their tools round by round: on this kind of virtual machine what runs right after gigabytes were deleted
# can be much slower (the freed memory goes back to the host and is faulted in again), and a fixed order would
# always hand that to the same tool.
# Its locals are prefixed: bash scoping is dynamic, and the functions it runs read their caller's variables (i).
rotate() {
  local _rot_round=$1 _rot_k
  shift
  local _rot_fns=("$@")
  for ((_rot_k = 0; _rot_k < ${#_rot_fns[@]}; _rot_k++)); do "${_rot_fns[(_rot_round + _rot_k) % ${#_rot_fns[@]}]}"; done
}
