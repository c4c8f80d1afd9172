#!/usr/bin/env bash
# make e2e-fleet: build the pinned cluster and Kraken, start the multi-node cluster (e2e/fleet/cluster/up.sh: 3
# nodes, modelpack and Kraken deployed from deploy/overlays/fleet-cluster-kraken), run the `fleet`-tagged Go tests
# (the cluster suite in e2e/fleet/cluster, and the simulated-node suite in e2e/fleet, one package at a time) and
# always tear the cluster down — the trap runs down.sh on success, failure or interrupt, and a teardown that
# leaves anything behind fails the run.
set -euo pipefail
source "$(dirname "$0")/cluster/env.sh"
source "$ROOT/e2e/cluster/lib.sh"
cd "$ROOT"
t0=$(date +%s)
bash e2e/cluster/deps.sh
bash e2e/cluster/build.sh
bash e2e/fleet/build.sh
echo "e2e-fleet: build done at +$(( $(date +%s) - t0 )) s"
take_lock
teardown() {
  local rc=$? keep=0
  [ $rc -ne 0 ] && keep=1   # keep the logs of a failed run
  KEEP=$keep bash e2e/fleet/cluster/down.sh || rc=1
  echo "e2e-fleet: rc=$rc total $(( $(date +%s) - t0 )) s"
  exit $rc
}
trap teardown EXIT
trap 'exit 130' INT TERM
bash e2e/fleet/cluster/up.sh
echo "e2e-fleet: up at +$(( $(date +%s) - t0 )) s"
MODELPACK_CLUSTER_DIR=$RUN go test -count=1 -p 1 -tags fleet -timeout 20m -v ${E2E_FLEET_RUN:+-run "$E2E_FLEET_RUN"} ./e2e/fleet/... 2>&1 | tee "$RUN/suite.log"
exit "${PIPESTATUS[0]}"
