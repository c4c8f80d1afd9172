#!/usr/bin/env bash
# Pod start on the real local cluster (e2e/cluster), side by side: from `kubectl apply` to the container having
# read the last byte of the 2 GiB benchmark model, cold (nothing on the node) and warm (second pod), for
#   (a) the modelpack CSI inline volume,
#   (b) a native image volume holding the same weights as a container-image layer (how users do it on 1.36),
#   (c) an init container that downloads the model's blobs from the registry into an emptyDir.
# It starts its own cluster (waiting for the cluster lock) and always tears it down. Ratios are against (a).
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
source e2e/cluster/env.sh
MODEL_DIR=${MODEL_DIR:-/var/tmp/modelpack-bench/model}
if [ ! -f "$MODEL_DIR/.complete" ]; then
  rm -rf "$MODEL_DIR"
  go run ./internal/cmd/genmodel --shards 4 --shard-size 512MiB "$MODEL_DIR"
  touch "$MODEL_DIR/.complete"
fi
WARM_RUNS=${WARM_RUNS:-3}

bash e2e/cluster/deps.sh
bash e2e/cluster/build.sh >/dev/null
exec 9>>"$LOCK"
flock -w "${LOCK_WAIT:-1800}" 9
trap 'bash e2e/cluster/down.sh >&2' EXIT
bash e2e/cluster/up.sh >&2

# (a) the model as a ModelPack artifact; (b) the same files as one image layer; (c) the artifact's blobs.
MODELPACK_HOME=$RUN/bench-home modelpack pack "$MODEL_DIR" -t $REGISTRY/bench/model:v1 --push --plain-http -q >/dev/null
accept='Accept: application/vnd.oci.image.manifest.v1+json'
model_digest=$(curl -fsSI -H "$accept" http://$REGISTRY/v2/bench/model/manifests/v1 | tr -d '\r' | awk -F': ' 'tolower($1)=="docker-content-digest"{print $2}')
MODEL_REF=$REGISTRY/bench/model@$model_digest
# digest=path of every layer: ModelPack layers here are raw files, named by their filepath annotation.
blobs=$(curl -fsS -H "$accept" http://$REGISTRY/v2/bench/model/manifests/v1 | python3 -c 'import json,sys; print(" ".join(l["digest"]+"="+l["annotations"]["org.cncf.model.filepath"] for l in json.load(sys.stdin)["layers"]))')
files=(); for f in $(cd "$MODEL_DIR" && find . -type f ! -name .complete | sed 's#^\./##'); do files+=(--file "$MODEL_DIR/$f=/model/$f"); done
IMAGE_REF=$("$RUN/images/ociimage" "${files[@]}" $REGISTRY/bench/weights-image:v1)
BUSYBOX=$(cat "$RUN/images/busybox.ref")

# The container reads every byte, then prints the host-shared monotonic clock (/proc/uptime, 10 ms).
READ='cat $(find /model -type f) > /dev/null; echo "done $(cut -d" " -f1 /proc/uptime)"'
pod() { # NAME VARIANT
  local name=$1 vol init=""
  case $2 in
    csi)   vol="{name: model, csi: {driver: modelpack.csi.dev, readOnly: true, volumeAttributes: {reference: \"$MODEL_REF\"}}}" ;;
    image) vol="{name: model, image: {reference: \"$IMAGE_REF\", pullPolicy: IfNotPresent}}" ;;
    init)  vol="{name: model, emptyDir: {}}"
           local dl="cd /model" b; for b in $blobs; do
             dl="$dl && wget -q -O ${b#*=} http://$REGISTRY/v2/bench/model/blobs/${b%%=*}"; done
           init="  initContainers:
  - {name: download, image: \"$BUSYBOX\", command: [/bin/sh, -c, \"$dl\"], volumeMounts: [{name: model, mountPath: /model}]}" ;;
  esac
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $name}
spec:
  nodeName: $NODE
  hostNetwork: true
  automountServiceAccountToken: false
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
$init
  containers:
  - name: c
    image: "$BUSYBOX"
    command: [/bin/sh, -c, '$READ']
    volumeMounts: [{name: model, mountPath: /model, readOnly: true}]
  volumes: [$vol]
YAML
}
# start_to_read NAME VARIANT: seconds from apply to the container's last read byte.
start_to_read() {
  local name=$1 t0 t1 phase
  drop_caches
  pod "$name" "$2" > "$RUN/$name.yaml"
  t0=$(cut -d' ' -f1 /proc/uptime)
  kubectl apply -f "$RUN/$name.yaml" >/dev/null
  for _ in $(seq 3000); do
    phase=$(kubectl get pod "$name" -o jsonpath='{.status.phase}')
    [ "$phase" = Succeeded ] || [ "$phase" = Failed ] && break
    sleep 0.2
  done
  [ "$phase" = Succeeded ] || { kubectl describe pod "$name" >&2; exit 1; }
  t1=$(kubectl logs "$name" | awk '$1=="done"{print $2}')
  kubectl delete pod "$name" --wait=true >/dev/null
  awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f\n", b-a}'
}

declare -A cold warm
for v in csi image init; do
  cold[$v]=$(start_to_read bench-$v-cold $v)
  w=(); for i in $(seq "$WARM_RUNS"); do w+=("$(start_to_read bench-$v-warm-$i $v)"); done
  warm[$v]=$(median "${w[@]}")
done
printf '%-58s %10s %10s %12s %12s\n' "pod start → last byte read (2 GiB, real kubelet)" "cold s" "warm s" "cold ratio" "warm ratio"
for v in csi image init; do
  case $v in
    csi)   label="(a) modelpack CSI inline volume" ;;
    image) label="(b) native image volume, weights as an image layer" ;;
    init)  label="(c) init container downloads into an emptyDir" ;;
  esac
  printf '%-58s %10s %10s %11sx %11sx\n' "$label" "${cold[$v]}" "${warm[$v]}" "$(ratio "${cold[$v]}" "${cold[csi]}")" "$(ratio "${warm[$v]}" "${warm[csi]}")"
done
echo "(ratios: time of the row / time of (a); warm = median of $WARM_RUNS)"
