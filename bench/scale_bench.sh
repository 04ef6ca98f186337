#!/usr/bin/env bash
# scale_bench.sh - a data-parallel job's scaling on this machine: N = 1, 2, 4 ranks x
# K = 1, 2 ferry-ps, bsp, PTB small (E = H = 200), 20 columns per rank (weak scaling:
# the global batch is 20 N). Per configuration: the job's tokens/s, the wire bytes one
# rank moves per step (its RPC clients' counters), the servers' CPU time per step per
# rank (/proc: utime + stime of every ferry-ps over the measured steps), and the share
# of a rank's time spent in GradNorm/Step (waiting for the others and for the update).
# The baseline, in the same run: one local trainer (everything in one process) with
# batch 20, the work of one rank without any distribution. Medians of REPS runs.
#
#   bench/scale_bench.sh [BUILD_DIR] [REPS]          # default: build 3
#
# The machine has few cores: N ranks + K servers share them, so the figures measure
# the per-step costs (bytes, server CPU, waiting) more than the scaling a cluster gets;
# docs/scaling.md turns those costs into a model for 8, 64 and 512 trainers.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BIN=${1:-build}
REPS=${2:-3}
STEPS=60 # measured: steps 21..60 (the first 20 warm up)
TMP=$(mktemp -d /tmp/ferry-scale.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT
export FERRY_PROGRESS=off OPENBLAS_NUM_THREADS=1

echo "machine: $(bench_cpu_model), $(nproc) cores, $(($(grep MemTotal /proc/meminfo | awk '{print $2}') / 1048576)) GiB"
echo "BLAS: OpenBLAS $(bench_kernels "$BIN") kernels, 1 thread per process"

DATA=(--data data/ptb --train-tokens 400000 --eval-tokens 1000 --epochs 1 --bptt 20
    --max-steps "$STEPS" --log-interval 20)

HZ=$(getconf CLK_TCK)

# tokens/s over steps 21..60: FILE TOKENS_PER_STEP, from the train events' elapsed_s.
window_tok_s() {
    awk -v tps="$2" '/"event":"train"/ {
        match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7)
        match($0, /"elapsed_s":[0-9.e+-]+/); e = substr($0, RSTART + 12, RLENGTH - 12)
        el[s] = e + 0 }
        END { if (el[60] > el[20]) printf "%.0f\n", 40 * tps / (el[60] - el[20]); else print 0 }' "$1"
}
event_field() { # FILE EVENT FIELD: the field of the last such event
    grep "\"event\":\"$2\"" "$1" | tail -1 | sed "s/.*\"$3\":\([^,}]*\).*/\1/"
}

run_local() {
    "$BIN/worker/ferry-trainer" --local "${DATA[@]}" --batch-size 20 \
        --metrics-out "$TMP/local.jsonl" 2>/dev/null
    window_tok_s "$TMP/local.jsonl" $((20 * 20))
}

run_job() { # N K -> "tok/s bytes/step server_ms/step/rank sync_fraction"
    local n=$1 k=$2 pids=() targets=""
    for i in $(seq 0 $((k - 1))); do
        rm -f "$TMP/ps$i.port"
        "$BIN/server/ferry-ps" --listen 127.0.0.1:0 --port-file "$TMP/ps$i.port" 2>/dev/null &
        pids+=($!)
    done
    for i in $(seq 0 $((k - 1))); do
        for _ in $(seq 200); do [ -s "$TMP/ps$i.port" ] && break; sleep 0.05; done
        targets+="${targets:+,}127.0.0.1:$(cat "$TMP/ps$i.port")"
    done
    local t0 trs=()
    t0=$(bench_ticks "${pids[@]}")
    for r in $(seq 0 $((n - 1))); do
        "$BIN/worker/ferry-trainer" --ps "$targets" --job scale --world "$n" --rank "$r" --sync bsp \
            "${DATA[@]}" --batch-size $((20 * n)) --metrics-out "$TMP/r$r.jsonl" 2>"$TMP/r$r.log" &
        trs+=($!)
    done
    for p in "${trs[@]}"; do wait "$p" || { echo "a rank failed: $(tail -2 "$TMP"/r*.log)" >&2; exit 1; }; done
    local t1
    t1=$(bench_ticks "${pids[@]}")
    kill -TERM "${pids[@]}"
    wait "${pids[@]}" 2>/dev/null || true
    local tok bytes sync
    tok=$(window_tok_s "$TMP/r0.jsonl" $((20 * 20 * n)))
    bytes=$(event_field "$TMP/r0.jsonl" job wire_bytes_per_step)
    sync=$(event_field "$TMP/r0.jsonl" job sync_fraction)
    awk -v tok="$tok" -v b="$bytes" -v t="$((t1 - t0))" -v hz="$HZ" -v n="$n" -v s="$STEPS" -v y="$sync" \
        'BEGIN { printf "%s %.0f %.2f %.2f\n", tok, b, 1000 * t / hz / s / n, y }'
}

base=$(for _ in $(seq "$REPS"); do run_local; done | median)
echo "baseline: local trainer, batch 20: $base tokens/s (median of $REPS)"
printf "\n%-3s %-3s %12s %10s %14s %18s %10s\n" N K "job tok/s" "vs local" "MB/step/rank" "server ms/step/rank" "in sync"
for k in 1 2; do
    for n in 1 2 4; do
        for rep in $(seq "$REPS"); do run_job "$n" "$k"; done >"$TMP/res"
        tok=$(cut -d' ' -f1 "$TMP/res" | median)
        mb=$(cut -d' ' -f2 "$TMP/res" | median)
        ms=$(cut -d' ' -f3 "$TMP/res" | median)
        sy=$(cut -d' ' -f4 "$TMP/res" | median)
        awk -v n="$n" -v k="$k" -v tok="$tok" -v base="$base" -v mb="$mb" -v ms="$ms" -v sy="$sy" \
            'BEGIN { printf "%-3d %-3d %12.0f %9.2fx %14.2f %18.2f %9.0f%%\n", n, k, tok, tok / base, mb / 1e6, ms, 100 * sy }'
    done
done
