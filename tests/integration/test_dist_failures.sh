#!/usr/bin/env bash
# Failure handling across processes: a ferry-ps killed mid-training makes the trainer
# fail within its deadline with an error naming the peer (no hang); a trainer killed
# mid-step leaves a context that the server sweeps after --context-ttl.
. "$(dirname "$0")/lib.sh"

start_ps_ttl() { # start_ps_ttl [TTL]: ferry-ps "ps", context TTL (default 60 s)
    start_ps ps --context-ttl "${1:-60}" --shutdown-grace-ms 300
}

wait_for() { # wait_for FILE PATTERN SECONDS
    for _ in $(seq $(($3 * 20))); do
        grep -q "$2" "$1" && return 0
        sleep 0.05
    done
    fail "timed out waiting for '$2' in $1: $(tail -3 "$1")"
}

# 1. ferry-ps dies (SIGKILL) while the trainer is stepping.
start_ps_ttl
"$TRAINER" --ps "127.0.0.1:$PORT" --data "$FERRY_SRC/data/ptb" --log-interval 5 \
    --deadline-ms 3000 2>"$TMP/t1.log" &
TPID=$!
wait_for "$TMP/t1.log" "step 10/" 60
kill -KILL "$PS_PID"
wait "$PS_PID" 2>/dev/null || true
t0=$(date +%s)
rc=0
wait "$TPID" || rc=$?
t1=$(date +%s)
[ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] || fail "trainer exit $rc after its ferry-ps died"
[ $((t1 - t0)) -le 15 ] || fail "trainer took $((t1 - t0)) s to notice its dead ferry-ps"
grep -v '^[0-9T:.-]*Z [IW] ' "$TMP/t1.log" | grep -q "127.0.0.1:$PORT" ||
    fail "error does not name the peer: $(tail -2 "$TMP/t1.log")"
ok "dead ferry-ps: trainer failed in $((t1 - t0)) s naming the peer: $(tail -1 "$TMP/t1.log")"

# 2. The trainer dies (SIGKILL) mid-step: its context is swept after the 1 s lease.
start_ps_ttl 1
"$TRAINER" --ps "127.0.0.1:$PORT" --data "$FERRY_SRC/data/ptb" --log-interval 5 \
    2>"$TMP/t2.log" &
TPID=$!
wait_for "$TMP/t2.log" "step 10/" 60
kill -KILL "$TPID"
wait "$TPID" 2>/dev/null || true
wait_for "$TMP/ps.log" "swept" 10
ok "killed trainer: $(grep -m1 swept "$TMP/ps.log" | sed 's/.*ferry-ps: //')"
kill -TERM "$PS_PID"
wait "$PS_PID" || fail "ferry-ps exited $? on SIGTERM"
finish
