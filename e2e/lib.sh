# Shared helpers for the e2e shell scripts (the demo and e2e/bench-cluster.sh; the other benchmarks are Go:
# internal/cmd/bench). Source it; it expects to run from the repo root.
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

# ratio A B: prints A/B to 2 decimals.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }

# drop_caches: makes "cold" mean cold disk too, where permitted.
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
