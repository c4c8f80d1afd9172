#!/usr/bin/env bash
# Installs the Debian packages the local cluster runs on, when any is missing: runc, the CNI plugins,
# busybox-static (test images and the driver image), iptables and conntrack (kubelet), and tesseract-ocr with its
# English model (the inference pods' program, and the model they mount).
set -euo pipefail
missing=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
for p in runc containernetworking-plugins busybox-static iptables conntrack tesseract-ocr tesseract-ocr-eng; do have "$p" || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
