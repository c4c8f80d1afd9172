#!/usr/bin/env bash
# make demo: the main job end to end on the embedded default (a local OCI-layout store), then through a real
# local registry into a read-only mount made by the CSI node driver — with kubelet played by e2e/cmd/csiclient.
# Needs root for the mount (as the driver does on a node).
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

DEMO=${DEMO_DIR:-$(mktemp -d /tmp/modelpack-demo.XXXXXX)}
export MODELPACK_HOME=$DEMO/home
export COSIGN_PASSWORD=demo-password
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
# fail stops the demo: under set -e a check written as `cmd && echo ok` would let a failing cmd pass.
fail() { echo "FAIL: $*" >&2; exit 1; }
DRIVER_PID=
cleanup() {
  [ -n "${TARGET:-}" ] && mountpoint -q "$TARGET" 2>/dev/null && csiclient -endpoint "unix://$DEMO/csi.sock" unpublish -target "$TARGET" >/dev/null 2>&1 || true
  [ -n "$DRIVER_PID" ] && kill "$DRIVER_PID" 2>/dev/null && wait "$DRIVER_PID" 2>/dev/null || true
  [ -n "${REGISTRY_PID:-}" ] && kill "$REGISTRY_PID" 2>/dev/null || true
  # A directory the demo made for itself goes with it; DEMO_DIR=… keeps the model, the store and the registry.
  [ -n "${DEMO_DIR:-}" ] || rm -rf "$DEMO"
}
trap cleanup EXIT
go build -o bin/csiclient ./e2e/cmd/csiclient

step "1. a sample model (2 safetensors shards, config, tokenizer, docs)"
go run ./internal/cmd/genmodel --shards 2 --shard-size 8MiB "$DEMO/model"
ls -l "$DEMO/model"

step "2. pack it into the local store ($MODELPACK_HOME, an OCI image layout)"
modelpack pack "$DEMO/model" -t demo/llama:v1
modelpack list

step "3. inspect"
modelpack inspect demo/llama:v1

step "4. unpack and compare with the source"
modelpack unpack demo/llama:v1 "$DEMO/unpacked"
diff -r "$DEMO/model" "$DEMO/unpacked" || fail "unpacked files differ from the source"
echo "unpacked files are identical to the source"

step "5. a real registry on loopback, a cosign key pair, push and sign the digest"
start_registry "$DEMO/registry"
REF=$REGISTRY/demo/llama:v1
modelpack key generate --output-key-prefix "$DEMO/cosign"
modelpack push "$REF" --from demo/llama:v1 --plain-http
modelpack sign "$REF" --key "$DEMO/cosign.key" --plain-http
modelpack verify "$REF" --key "$DEMO/cosign.pub" --plain-http --insecure-ignore-tlog   # offline: no Rekor here

step "6. the node driver, with a trust policy that requires that key"
cat > "$DEMO/policy.yaml" <<YAML
default: {mode: enforce, none: true}
rules:
- name: demo-models
  match: ["$REGISTRY/demo/*"]
  mode: enforce
  keys: ["$DEMO/cosign.pub"]
  transparencyLog: waive
YAML
modelpack csi-driver --endpoint "unix://$DEMO/csi.sock" --node-id demo-node --root "$DEMO/node" \
  --plain-http-registries "$REGISTRY" --policy "$DEMO/policy.yaml" --metrics-addr "" --log-format text \
  >"$DEMO/driver.log" 2>&1 &
DRIVER_PID=$!
for _ in $(seq 100); do [ -S "$DEMO/csi.sock" ] && break; sleep 0.1; done

step "7. kubelet publishes an inline volume for a pod"
TARGET=$DEMO/kubelet/pods/pod-1/volumes/kubernetes.io~csi/model/mount
csiclient -endpoint "unix://$DEMO/csi.sock" publish -target "$TARGET" -volume-id demo-vol-1 \
  -attr reference="$REF" -attr csi.storage.k8s.io/ephemeral=true -attr csi.storage.k8s.io/pod.name=pod-1
findmnt -no TARGET,FSTYPE,OPTIONS "$TARGET"
ls -l "$TARGET"

step "8. verify the mount: read-only, nosuid, nodev, and the same bytes as the source"
opts=$(findmnt -no OPTIONS "$TARGET")
for o in ro nosuid nodev; do [[ ",$opts," == *",$o,"* ]] || { echo "mount lacks $o: $opts"; exit 1; }; done
if touch "$TARGET/write-test" 2>"$DEMO/touch.err"; then echo "write succeeded on a read-only volume"; exit 1; fi
cat "$DEMO/touch.err"
(cd "$DEMO/model" && sha256sum $(find . -type f | sort)) > "$DEMO/source.sha256"
(cd "$TARGET" && sha256sum -c --quiet "$DEMO/source.sha256") || fail "the mounted files differ from the source"
echo "every file matches the source digest"

step "9. an unsigned model under the same rule is refused before any of its layers is pulled"
go run ./internal/cmd/genmodel --shards 1 --shard-size 1MiB --seed 99 "$DEMO/model2"
modelpack pack "$DEMO/model2" -t demo/unsigned:v1 -q
modelpack push "$REGISTRY/demo/unsigned:v1" --from demo/unsigned:v1 --plain-http -q
if csiclient -endpoint "unix://$DEMO/csi.sock" publish -target "$DEMO/kubelet/pods/pod-2/volumes/kubernetes.io~csi/model/mount" \
    -volume-id demo-vol-2 -attr reference="$REGISTRY/demo/unsigned:v1" -attr csi.storage.k8s.io/ephemeral=true 2>"$DEMO/denied.err"; then
  echo "an unsigned model was mounted"; exit 1
fi
cat "$DEMO/denied.err"
grep -q PermissionDenied "$DEMO/denied.err" || fail "the unsigned model was not refused with PERMISSION_DENIED"
! mountpoint -q "$DEMO/kubelet/pods/pod-2/volumes/kubernetes.io~csi/model/mount" 2>/dev/null || fail "the unsigned model is mounted"
echo "refused with PERMISSION_DENIED, nothing mounted"

step "10. unpublish"
csiclient -endpoint "unix://$DEMO/csi.sock" unpublish -target "$TARGET"
[ ! -e "$TARGET" ] || fail "the target is still there after unpublish"
echo "target removed"
TARGET=
echo
if [ -n "${DEMO_DIR:-}" ]; then echo "demo complete; its files are in $DEMO"; else echo "demo complete (DEMO_DIR=/some/dir make demo keeps its files)"; fi
