#!/usr/bin/env bash
# One command for a whole job on this machine: K ferry-ps and N ferry-trainer ranks
# of one data-parallel job, each process with its own log under a run directory,
# and a combined view that redraws one line per rank (its latest progress) and the
# job's line. Ctrl-C stops the trainers (they finish their step) and then the
# servers; the exit status is the first failing rank's.
#
#   scripts/cluster.sh --servers 2 --trainers 2 --sync bsp -- --epochs 1
#   scripts/cluster.sh --servers 1 --trainers 4 --sync ssp:2 --dir runs/ssp -- --max-steps 500
#
# Options (before --; everything after -- goes to every ferry-trainer):
#   --servers K        ferry-ps processes (default 2)
#   --trainers N       ranks (default 2)
#   --sync MODE        bsp | ssp:K | async (default bsp)
#   --job NAME         the job's name (default cluster)
#   --dir DIR          logs and metrics (default runs/cluster-<time>)
#   --bin DIR          the build directory (default build; built with scripts/build.sh
#                      when its binaries are missing)
#   --no-view          no redrawn view: wait and print each rank's last lines
# Logs: DIR/ps<i>.log, DIR/rank<r>.log, DIR/rank<r>.jsonl (metrics).
set -euo pipefail
cd "$(dirname "$0")/.."

servers=2 trainers=2 sync=bsp job=cluster dir="" bin=build view=1
while [ $# -gt 0 ]; do
    case "$1" in
    --servers) servers=$2; shift 2 ;;
    --trainers) trainers=$2; shift 2 ;;
    --sync) sync=$2; shift 2 ;;
    --job) job=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --no-view) view=0; shift ;;
    --) shift; break ;;
    -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cluster.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$servers" =~ ^[1-9][0-9]*$ && "$trainers" =~ ^[1-9][0-9]*$ ]] ||
    { echo "cluster.sh: --servers and --trainers take positive counts" >&2; exit 2; }
if [ ! -x "$bin/server/ferry-ps" ] || [ ! -x "$bin/worker/ferry-trainer" ]; then
    bash scripts/deps.sh
    bash scripts/build.sh
fi
dir=${dir:-runs/cluster-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$dir"

ps_pids=() tr_pids=()
stop_all() {
    trap - INT TERM EXIT
    for p in "${tr_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${tr_pids[@]}"; do wait "$p" 2>/dev/null || true; done
    for p in "${ps_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${ps_pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop_all EXIT
trap 'echo; echo "stopping (the ranks finish their step)..." >&2; stop_all; exit 130' INT TERM

targets=""
for i in $(seq 0 $((servers - 1))); do
    rm -f "$dir/ps$i.port"
    "$bin/server/ferry-ps" --listen 127.0.0.1:0 --port-file "$dir/ps$i.port" \
        --server-id "ps$i" 2>"$dir/ps$i.log" &
    ps_pids+=($!)
done
for i in $(seq 0 $((servers - 1))); do
    for _ in $(seq 200); do
        [ -s "$dir/ps$i.port" ] && break
        kill -0 "${ps_pids[$i]}" 2>/dev/null || { echo "ferry-ps $i failed:" >&2; cat "$dir/ps$i.log" >&2; exit 1; }
        sleep 0.05
    done
    targets+="${targets:+,}127.0.0.1:$(cat "$dir/ps$i.port")"
done
echo "job '$job': $servers ferry-ps ($targets), $trainers ranks, --sync $sync; logs in $dir" >&2

for r in $(seq 0 $((trainers - 1))); do
    FERRY_PROGRESS=plain "$bin/worker/ferry-trainer" --ps "$targets" --job "$job" \
        --world "$trainers" --rank "$r" --sync "$sync" --metrics-out "$dir/rank$r.jsonl" \
        "$@" 2>"$dir/rank$r.log" &
    tr_pids+=($!)
done

# The view: one line per rank (its latest progress or error) and the job's line.
last_line() { grep -v "^$" "$1" 2>/dev/null | grep -E "step [0-9]+/|done|error|ferry-trainer: [^0-9]|valid|test" | tail -1 | cut -c1-150; }
running() { for p in "${tr_pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
if [ "$view" = 1 ] && [ -t 2 ]; then
    lines=$((trainers + 1))
    for _ in $(seq $lines); do echo >&2; done
    while running; do
        printf '\033[%dA' "$lines" >&2
        for r in $(seq 0 $((trainers - 1))); do
            printf '\033[2Krank %-3d %s\n' "$r" "$(last_line "$dir/rank$r.log" | sed 's/^[0-9T:.Z-]* I ferry-trainer: //')" >&2
        done
        printf '\033[2K%s\n' "$(grep "job '" "$dir/rank0.log" 2>/dev/null | tail -1 | sed 's/^[0-9T:.Z-]* I ferry-trainer: //' | cut -c1-200)" >&2
        sleep 1
    done
fi
rc=0
for r in $(seq 0 $((trainers - 1))); do
    if ! wait "${tr_pids[$r]}"; then
        [ "$rc" = 0 ] && rc=1
        echo "rank $r failed: $(tail -1 "$dir/rank$r.log")" >&2
    fi
done
for r in $(seq 0 $((trainers - 1))); do
    echo "rank $r: $(grep -E "valid|done:" "$dir/rank$r.log" | tail -2 | sed 's/^[0-9T:.Z-]* I ferry-trainer: //' | tr '\n' ' ')" >&2
done
exit "$rc"
