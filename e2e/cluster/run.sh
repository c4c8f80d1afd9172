#!/usr/bin/env bash
# make e2e-cluster: build the pinned cluster, start it, run the real-cluster suite (Go tests with the `cluster`
# build tag) and always tear it down — the trap runs down.sh on success, failure or interrupt, and a teardown
# that leaves anything behind fails the run.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
t0=$(date +%s)
bash e2e/cluster/deps.sh
bash e2e/cluster/build.sh
echo "e2e-cluster: build done at +$(( $(date +%s) - t0 )) s"
exec 9>>"$LOCK"
flock -w "${LOCK_WAIT:-1800}" 9 || { echo "cluster lock $LOCK still busy" >&2; exit 1; }
teardown() {
  local rc=$? keep=0
  [ $rc -ne 0 ] && keep=1   # keep the logs of a failed run
  KEEP=$keep bash e2e/cluster/down.sh || rc=1
  echo "e2e-cluster: rc=$rc total $(( $(date +%s) - t0 )) s"
  exit $rc
}
trap teardown EXIT
trap 'exit 130' INT TERM
bash e2e/cluster/up.sh
echo "e2e-cluster: up at +$(( $(date +%s) - t0 )) s"
go test -count=1 -tags cluster -timeout 20m -v ${E2E_CLUSTER_RUN:+-run "$E2E_CLUSTER_RUN"} ./e2e/cluster/... 2>&1 | tee "$RUN/suite.log"
exit "${PIPESTATUS[0]}"
