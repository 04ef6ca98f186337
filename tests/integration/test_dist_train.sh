#!/usr/bin/env bash
# ferry-ps + ferry-trainer as separate processes on 127.0.0.1: a few hundred steps
# on a PTB slice in each decoder mode must take the loss well below ln V; both
# daemons must exit 0 on SIGTERM.
. "$(dirname "$0")/lib.sh"

start_daemon() { # start_daemon NAME: a ferry-ps on an ephemeral port; sets PS_PID, PORT
    start_ps "$1" --shutdown-grace-ms 500
}

stop_ps() { # SIGTERM and a clean exit 0
    kill -TERM "$PS_PID"
    local rc=0
    wait "$PS_PID" || rc=$?
    [ "$rc" -eq 0 ] || fail "ferry-ps exited $rc on SIGTERM: $(tail -3 "$TMP/$1.log")"
}

for mode in sharded-softmax logits; do
    start_daemon "ps-$mode"
    "$TRAINER" --ps "127.0.0.1:$PORT" --decoder-mode "$mode" --data "$FERRY_SRC/data/ptb" \
        --train-tokens 130000 --eval-tokens 20000 --epochs 1 --max-steps 300 --log-interval 50 \
        --metrics-out "$TMP/m-$mode.jsonl" 2>"$TMP/t-$mode.log" ||
        fail "$mode: trainer exited $?: $(tail -5 "$TMP/t-$mode.log")"
    first=$(train_losses "$TMP/m-$mode.jsonl" | head -1)
    last=$(train_losses "$TMP/m-$mode.jsonl" | tail -1)
    awk -v f="$first" -v l="$last" 'BEGIN { exit !(f > l && l < 6.8) }' ||
        fail "$mode: loss did not fall well below ln V: $first -> $last"
    grep -q "epoch 1 valid: loss" "$TMP/t-$mode.log" || fail "$mode: no validation"
    ok "$mode: 300 distributed steps, loss $first -> $last"
    stop_ps "ps-$mode"
    ok "$mode: ferry-ps exited 0 on SIGTERM"
done

# The trainer stops cleanly on SIGTERM mid-epoch too (and checkpoints).
start_daemon ps-sig
"$TRAINER" --ps "127.0.0.1:$PORT" --data "$FERRY_SRC/data/ptb" --log-interval 5 \
    --save "$TMP/sig.ck" 2>"$TMP/t-sig.log" &
TPID=$!
for _ in $(seq 600); do
    grep -q "step 10/" "$TMP/t-sig.log" && break
    sleep 0.05
done
grep -q "step 10/" "$TMP/t-sig.log" || fail "trainer made no progress: $(tail -3 "$TMP/t-sig.log")"
kill -TERM "$TPID"
rc=0
wait "$TPID" || rc=$?
[ "$rc" -eq 0 ] || fail "trainer exited $rc on SIGTERM: $(tail -3 "$TMP/t-sig.log")"
grep -q "stopping on signal" "$TMP/t-sig.log" || fail "no stop line"
ls "$TMP"/sig.ck.r0.* >/dev/null 2>&1 || fail "no checkpoint on SIGTERM: $(ls "$TMP")"
ok "ferry-trainer exited 0 on SIGTERM with a checkpoint"
stop_ps ps-sig
finish
