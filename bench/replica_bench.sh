#!/usr/bin/env bash
# replica_bench.sh - what replicated shards cost and what a failover takes: a bsp job
# of 2 ranks x 2 shards, PTB small (E = H = 200, 20 columns per rank), with one server
# per shard (R = 1, 2 ferry-ps) and with two (R = 2, --replicas 2, 4 ferry-ps),
# interleaved in one run. Per configuration, medians of REPS runs: the job's tokens/s
# over steps 21..60, the servers' CPU per step (/proc utime + stime of every ferry-ps),
# the bytes rank 0 moves per step. R = 2 runs twice: primary-backup (the default: the
# backups apply the primary's summed gradient) and --replication active (every replica
# computes every call). Then, with R = 2 primary-backup: shard 0's primary SIGKILLed at
# step 30, frozen (SIGSTOP) at step 30 for 3 s (--deadline-ms 1000), and its backup
# SIGKILLed: the time of the step the failure hit, beside the median step. No roll-back
# happens in any (the script checks the log).
#
#   bench/replica_bench.sh [BUILD_DIR] [REPS] [-- TRAINER_FLAGS...]   # default: build 3
#
# TRAINER_FLAGS go to every rank (e.g. -- --local-vocab 5000: the decoder's tail in the
# trainers, less server work to replicate).
#
# Every process shares this machine's cores: active R = 2 doubles the servers' work on
# the same cores, so its ratio here is an upper bound of the cost a cluster pays, where
# each replica has cores of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BIN=${1:-build}
REPS=${2:-3}
shift $(($# < 2 ? $# : 2))
[ "${1:-}" = -- ] && shift
EXTRA=("$@")
STEPS=60
TMP=$(mktemp -d /tmp/ferry-replica.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT
export FERRY_PROGRESS=off OPENBLAS_NUM_THREADS=1

echo "machine: $(bench_cpu_model), $(nproc) cores; $(date -u +%FT%TZ); $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "BLAS: OpenBLAS $(bench_kernels "$BIN") kernels, 1 thread per process"
DATA=(--data data/ptb --train-tokens 400000 --eval-tokens 1000 --epochs 1 --bptt 20
    --batch-size 40 --max-steps "$STEPS" --log-interval 1 --deadline-ms 1000 ${EXTRA[@]+"${EXTRA[@]}"})
echo "job: 2 bsp ranks x 2 shards, PTB small, ${DATA[*]}"

HZ=$(getconf CLK_TCK)
step_times() { # FILE: each step's seconds, "step seconds" per line
    awk '/"event":"train"/ {
        match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0
        match($0, /"elapsed_s":[0-9.e+-]+/); e = substr($0, RSTART + 12, RLENGTH - 12) + 0
        if (s > 1) printf "%d %.4f\n", s, e - prev; prev = e }' "$1"
}

# run R MODE [FAULT:S]: R replicas per shard, --replication MODE; FAULT kill|stop hits
# server S (0: shard 0's primary, 1: its backup) when rank 0 logs step 30. Prints
# "tok/s server_ms/step MB/step/rank ranks'_ms/step".
run() {
    local R=$1 mode=$2 f=${3:-} ns=$((2 * $1)) pids=() targets="" i
    local fault=${f%:*} victim=${f#*:}
    for ((i = 0; i < ns; i++)); do
        rm -f "$TMP/ps$i.port"
        "$BIN/server/ferry-ps" --listen 127.0.0.1:0 --port-file "$TMP/ps$i.port" 2>"$TMP/ps$i.log" &
        pids+=($!)
    done
    for ((i = 0; i < ns; i++)); do
        for _ in $(seq 200); do [ -s "$TMP/ps$i.port" ] && break; sleep 0.05; done
        targets+="${targets:+,}127.0.0.1:$(cat "$TMP/ps$i.port")"
    done
    local t0 trs=()
    t0=$(bench_ticks "${pids[@]}")
    rm -f "$TMP"/r*.jsonl
    for r in 0 1; do
        # The rank's own CPU, from the shell's accounting of its one child (`times`):
        # what a cluster, each replica on cores of its own, still pays on this side.
        (
            rc=0
            "$BIN/worker/ferry-trainer" --ps "$targets" --replicas "$R" --replication "$mode" \
                --job rb --world 2 \
                --rank "$r" --sync bsp "${DATA[@]}" --metrics-out "$TMP/r$r.jsonl" \
                2>"$TMP/r$r.log" || rc=$?
            times >"$TMP/cpu$r.all" # not in a pipe: a subshell has no children
            tail -1 "$TMP/cpu$r.all" >"$TMP/cpu$r"
            exit $rc
        ) &
        trs+=($!)
    done
    if [ -n "$fault" ]; then
        for _ in $(seq 3000); do grep -q '"step":30,' "$TMP/r0.jsonl" 2>/dev/null && break; sleep 0.01; done
        case $fault in
        kill) kill -9 "${pids[$victim]}" ;;
        stop) kill -STOP "${pids[$victim]}"; sleep 3; kill -CONT "${pids[$victim]}" ;;
        esac
    fi
    for p in "${trs[@]}"; do wait "$p" || { echo "a rank failed: $(tail -2 "$TMP"/r*.log)" >&2; exit 1; }; done
    local t1
    t1=$(bench_ticks "${pids[@]}")
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
    ! grep -q 'rolled back' "$TMP"/r*.log || { echo "$fault: a roll-back" >&2; exit 1; }
    local tok bytes
    tok=$(step_times "$TMP/r0.jsonl" | awk -v tps=$((20 * 40)) '$1 > 20 { t += $2; n++ } END { printf "%.0f", n * tps / t }')
    bytes=$(grep '"event":"job"' "$TMP/r0.jsonl" | tail -1 | sed 's/.*"wire_bytes_per_step":\([^,}]*\).*/\1/')
    local cpu # the ranks' user + sys seconds ("XmY.YYYs XmY.YYYs" per rank)
    cpu=$(cat "$TMP/cpu0" "$TMP/cpu1" | tr 'ms' '  ' |
        awk '{ t += 60 * $1 + $2 + 60 * $3 + $4 } END { printf "%.3f", t }')
    awk -v tok="$tok" -v b="$bytes" -v t="$((t1 - t0))" -v hz="$HZ" -v s="$STEPS" -v c="$cpu" \
        'BEGIN { printf "%s %.1f %.2f %.1f\n", tok, 1000 * t / hz / s, b / 1e6, 1000 * c / s }'
}

CONFIGS=("1 primary-backup" "2 primary-backup" "2 active")
for rep in $(seq "$REPS"); do
    for k in 0 1 2; do
        res=$(run ${CONFIGS[$k]})
        echo "$res" >>"$TMP/C$k"
        echo "rep $rep R=${CONFIGS[$k]}: $res (tok/s, server ms/step, MB/step/rank, ranks' ms/step)"
    done
done
[ "$REPS" -gt 0 ] && printf "\n%-18s %10s %10s %18s %16s %18s\n" R "tok/s" "vs R=1" \
    "server ms/step" "MB/step/rank" "ranks' ms/step"
[ "$REPS" -gt 0 ] && base=$(cut -d' ' -f1 "$TMP/C0" | median)
for k in 0 1 2; do
    [ "$REPS" -gt 0 ] || break
    tok=$(cut -d' ' -f1 "$TMP/C$k" | median)
    ms=$(cut -d' ' -f2 "$TMP/C$k" | median)
    mb=$(cut -d' ' -f3 "$TMP/C$k" | median)
    rk=$(cut -d' ' -f4 "$TMP/C$k" | median)
    name=${CONFIGS[$k]}
    [ "$k" = 0 ] && name=1
    awk -v R="$name" -v tok="$tok" -v base="$base" -v ms="$ms" -v mb="$mb" -v rk="$rk" \
        'BEGIN { printf "%-18s %10.0f %9.2fx %18.1f %16.2f %18.1f\n", R, tok, tok / base, ms, mb, rk }'
done

echo
for fault in kill:0 stop:0 kill:1; do
    run 2 primary-backup "$fault" >/dev/null
    step_times "$TMP/r0.jsonl" >"$TMP/steps"
    med=$(awk '$1 > 20 { print $2 }' "$TMP/steps" | median)
    worst=$(awk '$1 > 30 { print }' "$TMP/steps" | sort -k2 -g | tail -1)
    drop=$(grep -m1 -o 'its [A-Za-z]* failed ([^)]*)' "$TMP/r0.log" || echo "?")
    who=$([ "${fault#*:}" = 0 ] && echo "shard 0's primary" || echo "shard 0's backup")
    echo "failover (${fault%:*} $who at step 30): step ${worst% *} took ${worst#* } s, median step $med s; $drop"
done
