#!/usr/bin/env bash
# The local trainer end to end on a PTB slice: 300 SGD steps of the small model must
# take the training loss well below ln V = 9.21 (the loss of a uniform guess), write
# the metrics file, checkpoint, and resume from the checkpoint. A sanitized build
# (several times slower) trains 100 steps, the loss down by 0.3 at least, and
# evaluates less.
. "$(dirname "$0")/lib.sh"

STEPS=300 EVAL_TOKENS=20000 BELOW=6.8
[ -n "${FERRY_SANITIZE:-}" ] && STEPS=100 EVAL_TOKENS=5000 BELOW=
"$TRAINER" --local --data "$FERRY_SRC/data/ptb" --train-tokens 130000 \
    --eval-tokens "$EVAL_TOKENS" --epochs 1 --max-steps "$STEPS" --log-interval 50 \
    --metrics-out "$TMP/m.jsonl" --save "$TMP/lm.ck" 2>"$TMP/log" ||
    fail "trainer exited $?: $(tail -5 "$TMP/log")"
grep -q "epoch 1 valid: loss" "$TMP/log" || fail "no validation line: $(cat "$TMP/log")"
first=$(train_losses "$TMP/m.jsonl" | head -1)
last=$(train_losses "$TMP/m.jsonl" | tail -1)
awk -v f="$first" -v l="$last" -v below="$BELOW" \
    'BEGIN { exit !(f > l && (below == "" ? l < f - 0.3 : l < below + 0)) }' ||
    fail "loss did not fall well below ln V: first $first last $last"
ok "loss fell from $first to $last in $STEPS steps (ln V = 9.21)"
grep -q '"event":"eval","split":"valid"' "$TMP/m.jsonl" || fail "no valid eval event"
grep -q '"event":"eval","split":"test"' "$TMP/m.jsonl" || fail "no test eval event"
n=$(grep -c '"event":"train"' "$TMP/m.jsonl")
[ "$n" -eq $((STEPS / 50)) ] ||
    fail "expected $((STEPS / 50)) train events (every 50 of $STEPS steps), got $n"
ok "metrics file has train and eval events"
ls "$TMP/lm.ck.$STEPS" >/dev/null 2>&1 || fail "no checkpoint lm.ck.$STEPS written: $(ls "$TMP")"

# Exact resume: a run stopped with SIGTERM mid-epoch and resumed with --load alone
# (and --save, for its final state: the checkpoint carries the configuration, the
# batch position, the carried LSTM state and the learning rate; dropout masks follow
# the step) logs the losses of an uninterrupted run, step for step, and its metrics
# file holds both parts; at step 400 both runs' checkpoints hold the same state bit
# for bit (same_state).
RUN=(--local --data "$FERRY_SRC/data/ptb" --train-tokens 20000 --eval-tokens 2000 --epochs 2
    --emsize 64 --nhid 64 --bptt 10 --batch-size 8 --dropout 0.3 --max-steps 400
    --log-interval 1 --progress off)
"$TRAINER" "${RUN[@]}" --save "$TMP/a.ck" --metrics-out "$TMP/a.jsonl" 2>"$TMP/a.log" ||
    fail "uninterrupted run: $(tail -3 "$TMP/a.log")"
"$TRAINER" "${RUN[@]}" --save "$TMP/b.ck" --metrics-out "$TMP/b.jsonl" 2>"$TMP/b.log" &
BP=$!
wait_until "the run to log step 180" 300 logged "$TMP/b.jsonl" '"step":180,' "$BP"
kill -TERM "$BP"
wait "$BP" || fail "SIGTERM: exit $?: $(tail -3 "$TMP/b.log")"
grep -q "stopping on signal" "$TMP/b.log" || fail "no stop line"
cut=$(grep -o 'stopping on signal after step [0-9]*' "$TMP/b.log" | grep -o '[0-9]*$')
"$TRAINER" --load "$TMP/b.ck" --data "$FERRY_SRC/data/ptb" --metrics-out "$TMP/b.jsonl" \
    --save "$TMP/b.ck" --progress off 2>"$TMP/b2.log" || fail "resume: $(tail -3 "$TMP/b2.log")"
grep -q "resumed from $TMP/b.ck.$cut: epoch [12] at window [0-9]*, step $cut" "$TMP/b2.log" ||
    fail "no resume line: $(grep -i resum "$TMP/b2.log")"
grep -q '"event":"resume"' "$TMP/b.jsonl" || fail "no resume event in the metrics file"
[ "$(train_losses "$TMP/b.jsonl" | wc -l)" -eq 400 ] ||
    fail "the metrics file holds $(train_losses "$TMP/b.jsonl" | wc -l) train events, not 400"
cmp -s <(train_losses "$TMP/a.jsonl") <(train_losses "$TMP/b.jsonl") ||
    fail "resumed losses differ: $(diff <(train_losses "$TMP/a.jsonl") <(train_losses "$TMP/b.jsonl") | head -4)"
same_state "$TMP/a.ck.400" "$TMP/b.ck.400" "the resumed run at step 400"
ok "SIGTERM at step $cut of 400 (epoch 1 of 2, dropout on), --load (and --save): the same 400 losses, both parts in one metrics file, and at step 400 the same parameters, optimizer and carried state bit for bit"

# The README's example: --preset medium --save, then --load alone.
"$TRAINER" --preset medium --data "$FERRY_SRC/data/ptb" --train-tokens 4000 --eval-tokens 700 \
    --max-steps 2 --save "$TMP/lm-m.ck" 2>"$TMP/m1.log" || fail "medium: $(tail -3 "$TMP/m1.log")"
"$TRAINER" --data "$FERRY_SRC/data/ptb" --load "$TMP/lm-m.ck" --max-steps 3 2>"$TMP/m2.log" ||
    fail "--load of a medium checkpoint: $(tail -3 "$TMP/m2.log")"
grep -q "E=650 H=650" "$TMP/m2.log" || fail "the medium shape was not restored: $(grep model: "$TMP/m2.log")"
expect_error "a flag contradicting the checkpoint" "--nhid 200 contradicts the checkpoint" \
    "$TRAINER" --data "$FERRY_SRC/data/ptb" --load "$TMP/lm-m.ck" --nhid 200
ok "--preset medium --save, then --load alone: the medium model resumed"
finish
