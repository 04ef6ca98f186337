#!/usr/bin/env bash
# Configures and builds ferry into build/ (or $FERRY_BUILD_DIR); extra args go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${FERRY_BUILD_DIR:-build}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
