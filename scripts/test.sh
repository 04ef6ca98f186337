#!/usr/bin/env bash
# Checks the layering of the sources (scripts/check-layers.py: no #include reaches up
# or closes a cycle) and the public headers (scripts/check-exports.py: every function
# marked FERRY_API, no comment citing a private one), builds ferry and runs the whole test suite twice: a Release
# build with warnings as errors (its test_install installs libferry into a temporary
# prefix and builds examples/ against it out of tree), then a Debug build under
# AddressSanitizer + UndefinedBehaviorSanitizer; then every libFuzzer target for a
# bounded time (scripts/fuzz.sh, clang, ASan + UBSan).
# Installs missing Debian packages first. Usage: scripts/test.sh [--no-sanitize]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh slurm-wlm munge python3-grpcio python3-grpc-tools python3-prometheus-client prometheus openssl python3-matplotlib # slurm: test_job_slurm.sh; grpcio, openssl: test_security.sh, test_tls_errors.sh; prometheus-client: test_observability.sh; matplotlib: test_cli.sh (scripts/plot_metrics.py)
jobs=$(nproc)

echo "== layers (scripts/check-layers.py) =="
python3 scripts/check-layers.py --doc docs/architecture.md
echo "== the public API's marks and comments (scripts/check-exports.py) =="
python3 scripts/check-exports.py
echo "== every out-of-memory return says where (FERRY_NOMEM, common/core/log.h) =="
if grep -rnE 'return FERRY_ERR_NOMEM;|\w = FERRY_ERR_NOMEM;|: FERRY_ERR_NOMEM\b' \
    --include='*.c' --include='*.cu' common server worker optim; then
    echo "these leave ferry_error_last() stale: return FERRY_NOMEM() instead" >&2
    exit 1
fi

echo "== release build (-Werror) =="
cmake -S . -B build-ci -DCMAKE_BUILD_TYPE=Release -DFERRY_WERROR=ON >/dev/null
cmake --build build-ci -j"$jobs"
ctest --test-dir build-ci --output-on-failure -j"$jobs"

if [ "${1:-}" != "--no-sanitize" ]; then
    echo "== ASan + UBSan build =="
    cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DFERRY_WERROR=ON \
        -DFERRY_SANITIZE='address;undefined' >/dev/null
    cmake --build build-asan -j"$jobs"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE slow
fi

if [ "${1:-}" != "--no-sanitize" ]; then
    echo "== fuzz targets, bounded (scripts/fuzz.sh --seconds 10) =="
    bash scripts/fuzz.sh --seconds 10
fi
