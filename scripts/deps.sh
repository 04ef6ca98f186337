#!/usr/bin/env bash
# Installs the Debian 12 packages ferry builds against, if any is missing.
# Usage: scripts/deps.sh [extra-package ...]   (needs root or sudo for apt-get)
set -euo pipefail
pkgs=(build-essential cmake pkg-config libopenblas-dev libgrpc-dev protobuf-c-compiler
      libprotobuf-c-dev libuv1-dev zlib1g-dev libmicrohttpd-dev python3 "$@")
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "ferry: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
