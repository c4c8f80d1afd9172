# Shared helpers for the demo's shell script (the benchmarks are Go: internal/cmd/bench, e2e/cluster/bench). Source
# it; it expects to run from the repo root.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PATH="$ROOT/bin/tools:$ROOT/bin:$PATH"

# start_registry DIR: runs the tests' registry (e2e/cmd/registry: internal/testenv's configuration) with storage
# under DIR on a free port, exports REGISTRY=127.0.0.1:PORT and REGISTRY_PID, and waits until it answers.
start_registry() {
  local dir=$1
  mkdir -p "$dir"
  go build -o "$dir/serve-registry" ./e2e/cmd/registry
  "$dir/serve-registry" "$dir" >"$dir/host" 2>"$dir/serve.log" &
  REGISTRY_PID=$!
  for _ in $(seq 300); do
    if [ -s "$dir/host" ]; then
      REGISTRY=$(cat "$dir/host")
      export REGISTRY REGISTRY_PID
      return 0
    fi
    kill -0 "$REGISTRY_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "registry did not start:" >&2; cat "$dir/serve.log" >&2; return 1
}
