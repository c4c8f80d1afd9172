#!/usr/bin/env bash
# kraken-image.sh REF [--plain-http=false]: Uber Kraken's image, built as ours is (no container engine), pushed to
# REF; prints REF@digest. What deploy/components/p2p-kraken runs: Kraken's four binaries (bin/kraken, from
# e2e/fleet/build.sh: cgo, for sqlite) and Debian's nginx-light, which every Kraken component execs, with the
# shared libraries they link, nginx's config files (Kraken's nginx.conf includes mime.types) and the directories
# nginx needs; busybox for the sh, sed and chmod of the component's commands. `make kraken-image IMAGE=…` runs it;
# the fleet cluster (e2e/fleet/cluster/up.sh) pushes it to its registry.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ref=${1:?usage: kraken-image.sh REF [--plain-http=false]}
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
( cd "$ROOT" && go build -trimpath -o "$work/ociimage" ./e2e/cmd/ociimage )
: > "$work/empty"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\nwww-data:x:33:33:www-data:/var/www:/bin/false\n' > "$work/passwd"
printf 'root:x:0:\nnogroup:x:65534:\nwww-data:x:33:\n' > "$work/group"
files=()
for c in agent origin tracker build-index; do files+=(--file "$ROOT/bin/kraken/$c=/usr/bin/kraken-$c"); done
for d in /var/lib/nginx /var/log/nginx /var/run/kraken /var/log/kraken /var/cache/kraken /tmp; do files+=(--file "$work/empty=$d/.keep"); done
for a in sh sed mkdir cat ls chmod; do files+=(--link "/bin/$a=busybox"); done
"$work/ociimage" "$@" --libs "${files[@]}" --file /usr/sbin/nginx=/usr/sbin/nginx --dir /etc/nginx=/etc/nginx \
  --file "$(command -v busybox)=/bin/busybox" \
  --file /etc/ssl/certs/ca-certificates.crt=/etc/ssl/certs/ca-certificates.crt \
  --file "$work/passwd=/etc/passwd" --file "$work/group=/etc/group" "$ref"
