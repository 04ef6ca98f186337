#!/usr/bin/env bash
# load_bench.sh - how ferry-ps answers under hostile load, against the targets of its
# operating contract: with four clients flooding valid decoder Forwards (V 10000,
# H 650, 800 rows: 2 MiB requests, no grad), the health Check p99 <= 50 ms and Hello p99 <= 100 ms,
# and another identity's training step (embedding Forward, Backward, Step) slowed by
# at most its fair share; a recover offering 160k disjoint steps answered in < 100 ms.
# The baseline in the same run: the same health, Hello and step measured on the idle
# server just before the flood (and the raw Forward time, the flood's unit of work).
# Medians over REPS runs of each figure.
#
#   bench/load_bench.sh [BUILD_DIR] [REPS] [SECONDS]   # default: build 3 10
#
# It checks the targets (load_client.py with FERRY_T_TARGETS=1) and exits 1 when one is
# missed; tests/integration/test_load.sh runs the same cases in the suite, printing the
# figures without judging time.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build}
REPS=${2:-3}
SECS=${3:-10}
TMP=$(mktemp -d /tmp/ferry-load.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT
PY=/usr/bin/python3

cpu_model=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "machine: ${cpu_model:-unknown}, $(nproc) cores, $(($(grep MemTotal /proc/meminfo | awk '{print $2}') / 1048576)) GiB"
core=$(OPENBLAS_VERBOSE=2 "$BIN/server/ferry-ps" --help 2>&1 | grep -m1 "^Core:" | cut -d' ' -f2 || true)
echo "BLAS: OpenBLAS ${core:-?} kernels, 1 thread per GEMM (ferry-ps --blas-threads default), ferry-ps --threads 2"
"$PY" -m grpc_tools.protoc -Iproto --python_out="$TMP" --grpc_python_out="$TMP" proto/ferry.proto proto/health.proto
umask 077
A=$(openssl rand -hex 24) B=$(openssl rand -hex 24)
printf 'alice trainer %s\nbob trainer %s\n' "$A" "$B" >"$TMP/tokens"
export FERRY_T_TOKEN=$A FERRY_T_TOKEN2=$B FERRY_T_TARGETS=1
mkdir -p "$TMP/ck"

rc=0
for rep in $(seq "$REPS"); do
    rm -f "$TMP/port"
    "$BIN/server/ferry-ps" --listen 127.0.0.1:0 --port-file "$TMP/port" --token-file "$TMP/tokens" \
        --checkpoint-dir "$TMP/ck" --threads 2 2>"$TMP/ps.log" &
    pid=$!
    for _ in $(seq 200); do [ -s "$TMP/port" ] && break; sleep 0.05; done
    t="127.0.0.1:$(cat "$TMP/port")"
    "$PY" tests/integration/load_client.py "$TMP" "$t" fair "$SECS" >>"$TMP/fair.out" 2>&1 || rc=1
    "$PY" tests/integration/load_client.py "$TMP" "$t" recover 160000 >>"$TMP/recover.out" 2>&1 || rc=1
    kill "$pid"
    wait "$pid" || true
done
grep -v '=' "$TMP"/fair.out "$TMP"/recover.out || true # a missed target's message
med() { # med FILE KEY: the median of KEY's values
    sed -n "s/^$2=//p" "$1" | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "?" }'
}
F=$TMP/fair.out
echo
echo "medians of $REPS runs (${SECS} s of flood each):"
printf '  %-44s %10s %10s %8s\n' "" "idle" "flooded" "target"
printf '  %-44s %10s %10s %8s\n' "health Check p99 (ms)" "$(med "$F" health_alone_p99_ms)" "$(med "$F" health_p99_ms)" "<= 50"
printf '  %-44s %10s %10s %8s\n' "Hello p99 (ms)" "" "$(med "$F" hello_p99_ms)" "<= 100"
printf '  %-44s %10s %10s %8s\n' "other identity's step, median (ms)" "$(med "$F" other_step_alone_ms)" "$(med "$F" other_step_loaded_ms)" ""
printf '  %-44s %10s %10s %8s\n' "other identity's step, p90 (ms)" "" "$(med "$F" other_step_loaded_p90_ms)" ""
printf '  %-44s %10s %10s %8s\n' "one flood Forward, median (ms)" "" "$(med "$F" fair_forward_ms)" ""
printf '  %-44s %10s %10s %8s\n' "recover of 160k steps (ms)" "" "$(med "$TMP/recover.out" recover_ms)" "< 100"
printf '  %-44s %10s %10s %8s\n' "Stats behind it, max (ms)" "" "$(med "$TMP/recover.out" stats_meanwhile_max_ms)" ""
exit $rc
