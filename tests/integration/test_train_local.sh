#!/usr/bin/env bash
# The local trainer end to end on a PTB slice: 300 SGD steps of the small model must
# take the training loss well below ln V = 9.21 (the loss of a uniform guess), write
# the metrics file, checkpoint, and resume from the checkpoint.
. "$(dirname "$0")/lib.sh"

"$TRAINER" --local --data "$FERRY_SRC/data/ptb" --train-tokens 130000 --eval-tokens 20000 \
    --epochs 1 --max-steps 300 --log-interval 50 --metrics-out "$TMP/m.jsonl" \
    --save "$TMP/lm.ck" 2>"$TMP/log" || fail "trainer exited $?: $(tail -5 "$TMP/log")"
grep -q "epoch 1 valid: loss" "$TMP/log" || fail "no validation line: $(cat "$TMP/log")"
first=$(train_losses "$TMP/m.jsonl" | head -1)
last=$(train_losses "$TMP/m.jsonl" | tail -1)
awk -v f="$first" -v l="$last" 'BEGIN { exit !(f > l && l < 6.8) }' ||
    fail "loss did not fall well below ln V: first $first last $last"
ok "loss fell from $first to $last (ln V = 9.21)"
grep -q '"event":"eval","split":"valid"' "$TMP/m.jsonl" || fail "no valid eval event"
grep -q '"event":"eval","split":"test"' "$TMP/m.jsonl" || fail "no test eval event"
n=$(grep -c '"event":"train"' "$TMP/m.jsonl")
[ "$n" -eq 6 ] || fail "expected 6 train events (every 50 of 300 steps), got $n"
ok "metrics file has train and eval events"
[ -s "$TMP/lm.ck" ] || fail "no checkpoint written"

"$TRAINER" --data "$FERRY_SRC/data/ptb" --train-tokens 130000 --eval-tokens 20000 \
    --epochs 2 --max-steps 320 --log-interval 10 --load "$TMP/lm.ck" \
    --metrics-out "$TMP/m2.jsonl" 2>"$TMP/log2" || fail "resume failed: $(tail -3 "$TMP/log2")"
grep -q "resumed from .*epoch 1 done, step 300" "$TMP/log2" || fail "no resume line"
first2=$(train_losses "$TMP/m2.jsonl" | head -1)
awk -v a="$first2" 'BEGIN { exit !(a < 6.8) }' || fail "resumed run starts at loss $first2"
ok "resumed at step 300 with loss $first2"
finish
