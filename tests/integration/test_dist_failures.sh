#!/usr/bin/env bash
# Failure handling across processes: a ferry-ps killed mid-training makes the trainer
# fail (exit status 1..127, not a signal) with an error naming the peer; how long it
# took is reported, not checked (a hang meets ctest's timeout). A trainer killed
# mid-step leaves a context that the server sweeps after --context-ttl; that server
# then exits 0 on SIGTERM.
. "$(dirname "$0")/lib.sh"

start_ps_ttl() { # start_ps_ttl [TTL]: ferry-ps "ps", context TTL (default 60 s)
    start_ps ps --context-ttl "${1:-60}" --shutdown-grace-ms 300
}


# 1. ferry-ps dies (SIGKILL) while the trainer is stepping.
start_ps_ttl
"$TRAINER" --ps "127.0.0.1:$PORT" --data "$FERRY_SRC/data/ptb" --log-interval 5 \
    --deadline-ms 3000 2>"$TMP/t1.log" &
TPID=$!
wait_until "the trainer to reach step 10" 300 logged "$TMP/t1.log" "step 10/" "$TPID"
kill -KILL "$PS_PID"
reap_killed "$PS_PID" "ferry-ps"
t0=$(date +%s)
rc=0
wait "$TPID" || rc=$?
t1=$(date +%s)
[ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] || fail "trainer exit $rc after its ferry-ps died"
grep -v '^[0-9T:.-]*Z [IW] ' "$TMP/t1.log" >"$TMP/t1.err" || true
grep -q "127.0.0.1:$PORT" "$TMP/t1.err" ||
    fail "error does not name the peer: $(tail -2 "$TMP/t1.log")"
ok "dead ferry-ps: trainer failed in $((t1 - t0)) s naming the peer: $(tail -1 "$TMP/t1.log")"

# 2. The trainer dies (SIGKILL) mid-step: its context is swept after the 1 s lease.
start_ps_ttl 1
"$TRAINER" --ps "127.0.0.1:$PORT" --data "$FERRY_SRC/data/ptb" --log-interval 5 \
    2>"$TMP/t2.log" &
TPID=$!
wait_until "the trainer to reach step 10" 300 logged "$TMP/t2.log" "step 10/" "$TPID"
kill -KILL "$TPID"
reap_killed "$TPID" "the trainer"
wait_until "ferry-ps to sweep the dead trainer's context" 120 logged "$TMP/ps.log" "swept" "$PS_PID"
ok "killed trainer: $(grep -m1 swept "$TMP/ps.log" | sed 's/.*ferry-ps: //')"
stop_clean "$PS_PID" "ferry-ps" "$TMP/ps.log"
finish
