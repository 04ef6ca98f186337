#!/usr/bin/env bash
# --wire-dtype bf16 (proto section 3a): a one-rank bsp job, whose LSTM master copy
# lives on ferry-ps and is pulled and pushed every step beside the embedding rows and
# the decoder's activations, moves at most 55% of the bytes per step of the same job
# in f32, trains (its loss falls) and tracks the f32 job's losses within 2% (the
# servers' parameters and optimizer state stay float32; only what crosses the wire is
# rounded). A bf16 run says so in its log; --wire-dtype without --ps is refused.
. "$(dirname "$0")/lib.sh"

STEPS=40 LOGI=10
[ -n "${FERRY_SANITIZE:-}" ] && STEPS=20 LOGI=5
for w in f32 bf16; do
    start_ps "ps-$w" --shutdown-grace-ms 500
    "$TRAINER" --ps "127.0.0.1:$PORT" --job "wire-$w" --world 1 --rank 0 --sync bsp --wire-dtype "$w" \
        --data "$FERRY_SRC/data/ptb" --train-tokens 60000 --eval-tokens 5000 --epochs 1 \
        --max-steps "$STEPS" --log-interval "$LOGI" --metrics-out "$TMP/m-$w.jsonl" \
        2>"$TMP/t-$w.log" || fail "--wire-dtype $w: trainer exited $?: $(tail -5 "$TMP/t-$w.log")"
    kill -TERM "$PS_PID"
    wait "$PS_PID" || fail "ferry-ps ($w) exited $? on SIGTERM"
done
grep -q "wire bf16" "$TMP/t-bf16.log" || fail "the bf16 run does not say so: $(grep distributed "$TMP/t-bf16.log")"
grep -q "wire f32" "$TMP/t-f32.log" || fail "the f32 run does not say so"

# Bytes per step: the last job line of each run (steady state).
bytes() { grep '"event":"job"' "$1" | tail -1 | sed 's/.*"wire_bytes_per_step":\([^,}]*\).*/\1/'; }
b32=$(bytes "$TMP/m-f32.jsonl") b16=$(bytes "$TMP/m-bf16.jsonl")
awk -v a="$b16" -v b="$b32" 'BEGIN { exit !(b > 0 && a > 0 && a <= 0.55 * b) }' ||
    fail "bf16 moves $b16 bytes per step against f32's $b32 (want <= 55%)"
ok "bytes per bsp rank-step: f32 $b32, bf16 $b16 ($(awk -v a="$b16" -v b="$b32" 'BEGIN { printf "%.3f", a / b }')x)"

# The share of a rank's time in the dense block's pull and push: logged and in the event,
# a fraction above 0 (every step pulls and pushes) that leaves room for the rest.
pp=$(grep '"event":"job"' "$TMP/m-f32.jsonl" | tail -1 | sed -n 's/.*"pull_push_fraction":\([^,}]*\).*/\1/p')
awk -v f="$pp" 'BEGIN { exit !(f > 0 && f < 0.9) }' || fail "pull_push_fraction is '$pp'"
grep -q "% in pull/push, [0-9]*% in GradNorm/Step" "$TMP/t-f32.log" ||
    fail "the job line does not give the pull/push share: $(grep "job 'wire-f32' rank" "$TMP/t-f32.log" | tail -1)"
ok "the job line and event give the pull/push share of a rank's time ($pp)"

paste <(train_losses "$TMP/m-f32.jsonl") <(train_losses "$TMP/m-bf16.jsonl") |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 0.02 * $1) bad = 1; if (NR == 1) f = $2; l = $2; n++ }
         END { exit !(n >= 2 && !bad && l < f) }' ||
    fail "bf16 losses stray from f32's or do not fall: $(paste <(train_losses "$TMP/m-f32.jsonl") <(train_losses "$TMP/m-bf16.jsonl") | tr '\n' ' ')"
ok "bf16 losses within 2% of f32's and falling: $(paste -d/ <(train_losses "$TMP/m-f32.jsonl") <(train_losses "$TMP/m-bf16.jsonl") | tr '\n' ' ')"

expect_error "--wire-dtype bf16 without --ps" "--wire-dtype bf16 needs --ps" \
    "$TRAINER" --wire-dtype bf16 --data "$FERRY_SRC/data/ptb" --max-steps 1
expect_error "an unknown --wire-dtype" "fp8" "$TRAINER" --wire-dtype fp8 --data "$FERRY_SRC/data/ptb"
no_sanitizer_reports
ok "done"
