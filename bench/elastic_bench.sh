#!/usr/bin/env bash
# elastic_bench.sh - what an elastic job costs and what a member's death takes: a bsp
# job of 2 trainers on 2 ferry-ps, PTB small (E = H = 200, global batch 40, bptt 20),
# run with a fixed world (--world 2) and as an elastic job (--elastic 1:3, both
# trainers started together), interleaved, REPS times each. Per run: the job's tokens/s
# over steps 101..STEPS (both members admitted long before). Then an elastic job of 3
# trainers, one SIGKILLed when the first logs step 60: the seconds from the SIGKILL to
# the survivors' next completed step (the step redone), beside their median step. Last,
# the servers of a running elastic job of 2 trainers move 2 -> 3 -> 2 (ferry-ctl
# resize at steps ~60 and ~120): each move's bytes and seconds as ferry-ctl reports
# them, and the longest gap between two steps of the run beside the median step.
# Then ssp:1: a fixed world of 2 (--batch-size 40, 20 columns each) against an elastic
# ssp:1 job of 2 with the same 20 columns per rank (--elastic-batch per-rank), rank 0's
# pace over steps 101..STEPS, interleaved REPS times; and an elastic ssp:1 job of 3,
# one SIGKILLed at step 60: the seconds from the SIGKILL to the survivor's next step and
# its longest step-to-step gap, beside its median step (nothing is redone: the dead
# member just stops counting for the bound).
#
#   bench/elastic_bench.sh [BUILD_DIR] [REPS]      # default: build 3
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BIN=${1:-build}
REPS=${2:-3}
STEPS=200
TMP=$(mktemp -d /tmp/ferry-elastic.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT
export FERRY_PROGRESS=off OPENBLAS_NUM_THREADS=1

echo "machine: $(bench_cpu_model), $(nproc) cores; $(date -u +%FT%TZ); $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "BLAS: OpenBLAS $(bench_kernels "$BIN") kernels, 1 thread per process"
DATA=(--data data/ptb --train-tokens 400000 --eval-tokens 1000 --epochs 1 --bptt 20
    --batch-size 40 --log-interval 1 --lr 0.1)
echo "job: 2 ferry-ps, ${DATA[*]}"

servers() { # [N]: starts N (default 2) ferry-ps; sets PSS (their targets) and SPIDS
    SPIDS=()
    PSS=""
    local n=${1:-2}
    for ((i = 0; i < n; i++)); do
        rm -f "$TMP/ps$i.port"
        "$BIN/server/ferry-ps" --listen 127.0.0.1:0 --port-file "$TMP/ps$i.port" 2>"$TMP/ps$i.log" &
        SPIDS+=($!)
    done
    for ((i = 0; i < n; i++)); do
        for _ in $(seq 100); do [ -s "$TMP/ps$i.port" ] && break; sleep 0.05; done
        PSS=$PSS${PSS:+,}127.0.0.1:$(cat "$TMP/ps$i.port")
    done
}
stop_servers() {
    kill -TERM "${SPIDS[@]}" 2>/dev/null || true
    wait "${SPIDS[@]}" 2>/dev/null || true
}
elapsed_at() { # FILE STEP: the train event's elapsed_s at STEP
    grep "\"event\":\"train\",\"epoch\":1,\"step\":$2," "$1" | sed 's/.*"elapsed_s":\([0-9.e+-]*\).*/\1/'
}

# run fixed|elastic|ssp-fixed|ssp-elastic: prints the job's tokens/s over steps
# 101..STEPS (rank 0's view; ssp: 800 tokens per step of both ranks at rank 0's pace).
run() {
    servers
    local pids=() r
    for r in 0 1; do
        if [ "$1" = fixed ]; then
            "$BIN/worker/ferry-trainer" --ps "$PSS" --job b --world 2 --rank "$r" "${DATA[@]}" \
                --max-steps "$STEPS" --metrics-out "$TMP/m$r.jsonl" 2>"$TMP/r$r.log" &
        elif [ "$1" = ssp-fixed ]; then
            "$BIN/worker/ferry-trainer" --ps "$PSS" --job b --world 2 --rank "$r" "${DATA[@]}" \
                --sync ssp:1 --max-steps "$STEPS" --metrics-out "$TMP/m$r.jsonl" \
                2>"$TMP/r$r.log" &
        elif [ "$1" = ssp-elastic ]; then
            "$BIN/worker/ferry-trainer" --ps "$PSS" --job b --elastic 1:2 "${DATA[@]}" \
                --batch-size 20 --sync ssp:1 --max-steps "$STEPS" --metrics-out "$TMP/m$r.jsonl" \
                2>"$TMP/r$r.log" &
        else
            "$BIN/worker/ferry-trainer" --ps "$PSS" --job b --elastic 1:3 "${DATA[@]}" \
                --max-steps "$STEPS" --metrics-out "$TMP/m$r.jsonl" 2>"$TMP/r$r.log" &
        fi
        pids+=($!)
    done
    wait "${pids[@]}" || { tail -3 "$TMP"/r*.log >&2; exit 1; }
    stop_servers
    local a b
    a=$(elapsed_at "$TMP/m0.jsonl" 100)
    b=$(elapsed_at "$TMP/m0.jsonl" "$STEPS")
    awk -v a="$a" -v b="$b" -v n=$((STEPS - 100)) 'BEGIN { printf "%.0f\n", n * 800 / (b - a) }'
}

# compare LABEL FIXED ELASTIC: REPS runs of each kind, interleaved, and their medians.
compare() {
    local fx=() el=() i mf me
    for ((i = 1; i <= REPS; i++)); do
        fx+=("$(run "$2")")
        el+=("$(run "$3")")
        echo "${1}rep $i: fixed ${fx[-1]} tok/s, elastic ${el[-1]} tok/s"
    done
    mf=$(printf '%s\n' "${fx[@]}" | median)
    me=$(printf '%s\n' "${el[@]}" | median)
    echo "${1}median: fixed world $mf tok/s, elastic $me tok/s ($(awk -v a="$me" -v b="$mf" 'BEGIN { printf "%.3f", a / b }')x)"
}
compare "" fixed elastic

# death NAME [FLAG...]: an elastic job NAME of 3 trainers on 2 fresh ferry-ps (files
# $TMP/NAME<r>.jsonl and .log), the third SIGKILLed when the first logs step 60; sets
# KILLED (when) and AT (the first's train events by then).
death() {
    local name=$1 r
    shift
    servers
    local pids=()
    for r in 0 1 2; do
        "$BIN/worker/ferry-trainer" --ps "$PSS" --job "$name" --elastic 1:3 "${DATA[@]}" "$@" \
            --max-steps 120 --metrics-out "$TMP/$name$r.jsonl" 2>"$TMP/$name$r.log" &
        pids+=($!)
        sleep 0.3
    done
    until grep -q '"step":60,' "$TMP/${name}0.jsonl" 2>/dev/null; do sleep 0.01; done
    kill -9 "${pids[2]}"
    KILLED=$(date +%s.%N)
    AT=$(grep -c '"event":"train"' "$TMP/${name}0.jsonl")
    wait "${pids[0]}" "${pids[1]}" || { tail -3 "$TMP/$name"*.log >&2; exit 1; }
    wait "${pids[2]}" 2>/dev/null || true
    stop_servers
}

# A member's death: 3 trainers, one SIGKILLed at step 60.
death d
python3 - "$TMP/d0.log" "$TMP/d0.jsonl" "$KILLED" <<'EOF'
import datetime, json, statistics, sys
log, metrics, killed = sys.argv[1], sys.argv[2], float(sys.argv[3])
ev = [json.loads(l) for l in open(metrics)]
redo = [e for e in ev if e["event"] == "redo"]
if len(redo) != 1:
    sys.exit(f"{len(redo)} steps redone, want 1")
step = redo[0]["step"]
def when(s):
    for line in open(log):
        if f": step {s} |" in line:
            t = datetime.datetime.strptime(line[:23], "%Y-%m-%dT%H:%M:%S.%f")
            return t.replace(tzinfo=datetime.timezone.utc).timestamp()
times = sorted(e["elapsed_s"] for e in ev if e["event"] == "train")
gaps = [b - a for a, b in zip(times, times[1:])]
print(f"death: SIGKILL of 1 of 3 members at step ~60; step {step} redone; "
      f"{when(step) - killed:.3f} s from the SIGKILL to the survivors' next step "
      f"(median step {statistics.median(gaps):.3f} s)")
EOF

# The servers move under a running job: 2 -> 3 -> 2.
servers 3
P0=${PSS%%,*} REST=${PSS#*,}
P1=${REST%%,*} P2=${REST#*,}
pids=()
for r in 0 1; do
    "$BIN/worker/ferry-trainer" --ps "$P0,$P1" --job m --elastic 2:2 "${DATA[@]}" --max-steps 180 \
        --metrics-out "$TMP/v$r.jsonl" 2>"$TMP/v$r.log" &
    pids+=($!)
done
until grep -q '"step":60,' "$TMP/v0.jsonl" 2>/dev/null; do sleep 0.01; done
"$BIN/server/ferry-ctl" --ps "$P0,$P1" --to "$P0,$P1,$P2" resize m | tail -1
until grep -q '"step":120,' "$TMP/v0.jsonl" 2>/dev/null; do sleep 0.01; done
"$BIN/server/ferry-ctl" --ps "$P0,$P1,$P2" --to "$P0,$P2" resize m | tail -1
wait "${pids[@]}" || { tail -3 "$TMP"/v*.log >&2; exit 1; }
stop_servers
python3 - "$TMP/v0.jsonl" <<'EOF'
import json, statistics, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
times = sorted(e["elapsed_s"] for e in ev if e["event"] == "train")
gaps = [b - a for a, b in zip(times, times[1:])]
waits = ", ".join(f"{e['seconds']:.3f}" for e in ev if e["event"] == "servers")
print(f"moves: rank 0 followed them, waiting {waits} s; longest step-to-step gap "
      f"{max(gaps):.3f} s, median step {statistics.median(gaps):.3f} s")
EOF

# ssp:1: fixed against elastic, then a member's death.
compare "ssp:1 " ssp-fixed ssp-elastic
death s --batch-size 20 --sync ssp:1
python3 - "$TMP/s0.log" "$TMP/s0.jsonl" "$KILLED" "$AT" <<'EOF'
import datetime, json, statistics, sys
log, metrics, killed, at = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
ev = [json.loads(l) for l in open(metrics)]
if any(e["event"] in ("redo", "recover") for e in ev):
    sys.exit("a redo or roll-back in an ssp job")
train = [e for e in ev if e["event"] == "train"]
def when(s):
    for line in open(log):
        if f": step {s} |" in line:
            t = datetime.datetime.strptime(line[:23], "%Y-%m-%dT%H:%M:%S.%f")
            return t.replace(tzinfo=datetime.timezone.utc).timestamp()
nxt = train[at]["step"] if at < len(train) else None
times = sorted(e["elapsed_s"] for e in train)
gaps = [b - a for a, b in zip(times, times[1:])]
print(f"ssp:1 death: SIGKILL of 1 of 3 members at step ~60; nothing redone; "
      f"{when(nxt) - killed:.3f} s from the SIGKILL to the survivor's next step; longest "
      f"step-to-step gap {max(gaps):.3f} s, median step {statistics.median(gaps):.3f} s")
EOF
