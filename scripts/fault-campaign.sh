#!/usr/bin/env bash
# fault-campaign.sh - a fault campaign against crash recovery, by hand (not in CI): a
# bsp job of 2 ferry-ps x 2 ferry-trainer with dropout on and a checkpoint every 5
# steps (tests/integration/test_recovery.sh's job), run again and again with random
# faults over the whole run, its end included: one process or two at once (a server
# and a rank, both servers, both ranks) SIGKILLed at a random step or after the last
# step (while the ranks evaluate and leave), restarted at once or late (past the
# call deadline). Each trial must finish by itself bit-identical to an undisturbed run
# (every server's checkpoint of the last step, both ranks' parts, the last loss, each
# rank's final evaluations) with no temporary file left; or stop with one line naming
# the cause. It reports the count of each outcome and, for every server restarted
# before the end, the time from its "listening" line to the job's next step (rank 0's
# next step line), median and worst.
#
#   scripts/fault-campaign.sh [--build DIR] [--trials N] [--seed S] [--summary FILE]
#                             [--lock FILE] [--chunk K] [--keep DIR] [--servers-only 1]
#
# --servers-only 1: every trial kills one server at a random step and restarts it at
# once (the reconnection measurement: e.g. against another build, --build DIR).
# --lock FILE: hold FILE (flock) while running, K trials at a time (--chunk, default
# 3), so that others sharing the machine get the cores in between.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$SRC/build TRIALS=100 SEED=1 SUMMARY= LOCK= CHUNK=3 KEEP= SERVERS_ONLY=
while [ $# -gt 0 ]; do
    case $1 in
    --build) BUILD=$2 ;;
    --trials) TRIALS=$2 ;;
    --seed) SEED=$2 ;;
    --summary) SUMMARY=$2 ;;
    --lock) LOCK=$2 ;;
    --chunk) CHUNK=$2 ;;
    --keep) KEEP=$2 ;;
    --servers-only) SERVERS_ONLY=$2 ;;
    *) echo "usage: $0 [--build DIR] [--trials N] [--seed S] [--summary FILE] [--lock FILE] [--chunk K] [--keep DIR] [--servers-only 1]" >&2
        exit 2 ;;
    esac
    shift 2
done
PS=$BUILD/server/ferry-ps
TRAINER=$BUILD/worker/ferry-trainer
[ -x "$PS" ] && [ -x "$TRAINER" ] || { echo "$0: no ferry-ps/ferry-trainer in $BUILD" >&2; exit 2; }
TMP=$(mktemp -d /tmp/ferry-campaign.XXXXXX)
cleanup() {
    local pids
    pids=$(jobs -p || true)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
    [ -n "$KEEP" ] && mkdir -p "$KEEP" && cp -r "$TMP"/. "$KEEP"/ 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
export FERRY_PROGRESS=plain
STEPS=40
DATA=(--data "$SRC/data/ptb" --train-tokens 4000 --eval-tokens 400 --epochs 1
    --emsize 32 --nhid 32 --bptt 10 --batch-size 4 --dropout 0.3 --seed 7
    --max-steps "$STEPS" --checkpoint-every 5 --log-interval 1 --progress off
    --deadline-ms 2000 --sync-timeout 30 --recovery-timeout 60)

lock() { [ -z "$LOCK" ] || { exec 9>"$LOCK" && flock 9; }; }
unlock() { [ -z "$LOCK" ] || flock -u 9; }

# ps_start DIR S [PORT]: ferry-ps S of the job in DIR (its port in DIR/port$S).
ps_start() {
    local dir=$1 s=$2 port=${3:-0}
    rm -f "$dir/port$s"
    "$PS" --listen "127.0.0.1:$port" --port-file "$dir/port$s" --checkpoint-dir "$dir/ck$s" \
        --checkpoint-keep 20 --context-ttl 30 2>>"$dir/ps$s.log" &
    PSPID[$s]=$!
    for _ in $(seq 400); do
        [ -s "$dir/port$s" ] && break
        sleep 0.025
    done
    PORT[$s]=$(cat "$dir/port$s")
}

rank_start() { # DIR R
    "$TRAINER" --ps "127.0.0.1:${PORT[0]},127.0.0.1:${PORT[1]}" --job rec --world 2 --rank "$2" \
        "${DATA[@]}" --save "$1/save/lm" --metrics-out "$1/m$2.jsonl" 2>>"$1/r$2.log" &
    RPID[$2]=$!
}

# job DIR [VICTIMS AT DELAY]: one run; VICTIMS "ps1" or "ps0+r1", AT a step rank 0
# logged or "end" (both ranks wrote their parts of the last step). Sets RC0, RC1.
job() {
    local dir=$1 victims=${2:-} at=${3:-} delay=${4:-0} v
    mkdir -p "$dir/ck0" "$dir/ck1" "$dir/save"
    ps_start "$dir" 0
    ps_start "$dir" 1
    rank_start "$dir" 0
    rank_start "$dir" 1
    if [ -n "$victims" ]; then
        for _ in $(seq 3000); do
            if [ "$at" = end ]; then
                [ -s "$dir/save/lm.r0.$STEPS" ] && [ -s "$dir/save/lm.r1.$STEPS" ] && break
            else
                grep -q "\"event\":\"train\".*\"step\":$at," "$dir/m0.jsonl" 2>/dev/null && break
            fi
            kill -0 "${RPID[0]}" 2>/dev/null || break
            sleep 0.02
        done
        for v in ${victims//+/ }; do
            case $v in
            ps*) kill -9 "${PSPID[${v#ps}]}" 2>/dev/null || true ;;
            r*) kill -9 "${RPID[${v#r}]}" 2>/dev/null || echo missed >"$dir/missed" ;;
            esac
        done
        sleep "$delay"
        for v in ${victims//+/ }; do
            case $v in
            ps*)
                wait "${PSPID[${v#ps}]}" 2>/dev/null || true
                echo "=== restarted" >>"$dir/ps${v#ps}.log"
                ps_start "$dir" "${v#ps}" "${PORT[${v#ps}]}"
                ;;
            r*)
                wait "${RPID[${v#r}]}" 2>/dev/null || true
                echo "=== restarted" >>"$dir/r${v#r}.log"
                rank_start "$dir" "${v#r}"
                ;;
            esac
        done
    fi
    RC0=0 RC1=0
    # A trial that hangs is a failure: 5 minutes at most.
    for _ in $(seq 3000); do
        kill -0 "${RPID[0]}" 2>/dev/null || kill -0 "${RPID[1]}" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "${RPID[0]}" 2>/dev/null && kill -9 "${RPID[0]}" && echo hung >>"$dir/hung"
    kill -0 "${RPID[1]}" 2>/dev/null && kill -9 "${RPID[1]}" && echo hung >>"$dir/hung"
    wait "${RPID[0]}" || RC0=$?
    wait "${RPID[1]}" || RC1=$?
    kill "${PSPID[0]}" "${PSPID[1]}" 2>/dev/null || true
    wait "${PSPID[0]}" "${PSPID[1]}" 2>/dev/null || true
}

evals() { for s in valid test; do grep "\"event\":\"eval\",\"split\":\"$s\"" "$1" | tail -1; done; }
last_loss() { grep '"event":"train"' "$1" | tail -1 | sed 's/.*"loss":\([^,]*\),.*/\1/'; }

# identical DIR: 0 when DIR's job ended as the reference did; else why, on stdout.
identical() {
    local d=$1 s r
    for s in 0 1; do
        cmp -s "$TMP/ref/ck$s/rec-step$STEPS.ckpt" "$d/ck$s/rec-step$STEPS.ckpt" ||
            { echo "server $s's checkpoint of step $STEPS differs or is missing"; return 1; }
    done
    for r in 0 1; do
        cmp -s "$TMP/ref/save/lm.r$r.$STEPS" "$d/save/lm.r$r.$STEPS" ||
            { echo "rank $r's part of step $STEPS differs or is missing"; return 1; }
        [ "$(evals "$TMP/ref/m$r.jsonl")" = "$(evals "$d/m$r.jsonl")" ] ||
            { echo "rank $r's final evaluations differ or are missing"; return 1; }
    done
    [ "$(last_loss "$TMP/ref/m0.jsonl")" = "$(last_loss "$d/m0.jsonl")" ] ||
        { echo "the last loss differs"; return 1; }
    [ -z "$(find "$d" -name '.*.??????' | head -1)" ] || { echo "temporary files left"; return 1; }
}

# restart_times DIR: for each server restarted before the end, seconds from its
# "listening" line to rank 0's next step line.
restart_times() {
    local d=$1 s
    for s in 0 1; do
        grep -q "=== restarted" "$d/ps$s.log" 2>/dev/null || continue
        python3 - "$d/ps$s.log" "$d/r0.log" <<'EOF'
import sys, re, datetime
def ts(line):
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z", line)
    return datetime.datetime.fromisoformat(m.group(1)).timestamp() if m else None
ps, r0 = open(sys.argv[1]).read().split("=== restarted", 1)[1], open(sys.argv[2]).read()
up = next((ts(l) for l in ps.splitlines() if "listening on" in l and ts(l)), None)
steps = [ts(l) for l in r0.splitlines() if re.search(r"job 'rec' rank 0/2: step \d+", l) and ts(l)]
after = [t for t in steps if up is not None and t > up]
if after:
    print("%.3f" % (after[0] - up))
EOF
    done
}

lock
echo "reference run..." >&2
job "$TMP/ref"
[ "$RC0" = 0 ] && [ "$RC1" = 0 ] && [ -s "$TMP/ref/ck0/rec-step$STEPS.ckpt" ] ||
    { echo "$0: the undisturbed run failed: $(tail -3 "$TMP/ref/r0.log")" >&2; exit 1; }
unlock

singles=(ps0 ps1 r0 r1)
pairs=(ps0+r1 ps1+r0 ps0+ps1 r0+r1)
: >"$TMP/results" # trial victims at delay outcome detail
: >"$TMP/times"
RANDOM=$SEED
for trial in $(seq 1 "$TRIALS"); do
    [ $(((trial - 1) % CHUNK)) = 0 ] && lock
    if [ $((RANDOM % 10)) -lt 6 ]; then victims=${singles[$((RANDOM % 4))]}; else victims=${pairs[$((RANDOM % 4))]}; fi
    if [ $((RANDOM % 5)) = 0 ]; then at=end; else at=$((1 + RANDOM % STEPS)); fi
    case $((RANDOM % 10)) in 0 | 1) delay=3 ;; 2) delay=0.5 ;; *) delay=0 ;; esac
    [ -z "$SERVERS_ONLY" ] || { victims=ps$((RANDOM % 2)) at=$((2 + RANDOM % (STEPS - 4))) delay=0; }
    d=$TMP/t$trial
    job "$d" "$victims" "$at" "$delay"
    why=
    if [ -e "$d/hung" ]; then
        outcome=hung why="a rank was still running after 5 minutes"
    elif [ "$RC0" = 0 ] && [ "$RC1" = 0 ]; then
        if why=$(identical "$d"); then outcome=identical; else outcome=different; fi
    else
        outcome=stopped
        for r in 0 1; do
            rc=RC$r
            [ "${!rc}" = 0 ] && continue
            why="$why rank $r exit ${!rc}: $(grep -v '^[0-9T:.-]*Z [IW] ' "$d/r$r.log" | tail -1)"
        done
    fi
    [ -e "$d/missed" ] && why="$why (the rank had exited before the kill)"
    if [ "$at" != end ]; then restart_times "$d" >>"$TMP/times"; fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$trial" "$victims" "$at" "$delay" "$outcome" "$why" >>"$TMP/results"
    printf 'trial %3d: %-8s at %-4s restart +%-3s s: %s %s\n' "$trial" "$victims" "$at" "$delay" "$outcome" "$why" >&2
    [ -n "$KEEP" ] || [ "$outcome" != identical ] || rm -rf "$d"
    [ $((trial % CHUNK)) = 0 ] && unlock
done
unlock

python3 - "$TMP/results" "$TMP/times" "$TRIALS" "$SEED" <<'EOF' | tee ${SUMMARY:+"$SUMMARY"}
import sys, statistics, collections
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
times = sorted(float(x) for x in open(sys.argv[2]) if x.strip())
n = len(rows)
count = collections.Counter(r[4] for r in rows)
print("fault campaign: %d trials (seed %s), 2 ferry-ps x 2 ranks, bsp, dropout 0.3, "
      "checkpoints every 5 of 40 steps" % (n, sys.argv[4]))
print("  kills: %d single, %d double; %d after the last step, %d restarts late (0.5-3 s)" % (
    sum("+" not in r[1] for r in rows), sum("+" in r[1] for r in rows),
    sum(r[2] == "end" for r in rows), sum(r[3] != "0" for r in rows)))
for k in ("identical", "different", "stopped", "hung"):
    print("  %-10s %3d" % (k, count.get(k, 0)))
if times:
    print("  server restart -> job's next step: %d restarts, median %.2f s, p90 %.2f s, worst %.2f s"
          % (len(times), statistics.median(times), times[int(0.9 * (len(times) - 1))], times[-1]))
by = collections.defaultdict(collections.Counter)
for r in rows:
    by["%s at %s" % (r[1], "end" if r[2] == "end" else "a step")][r[4]] += 1
for k in sorted(by):
    print("    %-22s %s" % (k, ", ".join("%s %d" % kv for kv in sorted(by[k].items()))))
for r in rows:
    if r[4] != "identical":
        print("  trial %s: %s at %s, restart +%s s: %s:%s" % (r[0], r[1], r[2], r[3], r[4], r[5]))
EOF
