#!/usr/bin/env bash
# The life of a model on ferry-ps, as the trainer lives it: two models side by side on
# one server (--model), a second run of a model refused rather than silently trained
# on (--continue asks for it), a create that fails on one server leaving nothing on
# the other, --save with --ps refused before any step where a server cannot
# checkpoint, and a finished job continued with --load.
. "$(dirname "$0")/lib.sh"
CTL=$FERRY_BIN/server/ferry-ctl
D=$FERRY_SRC/data/ptb
SMALL=(--data "$D" --train-tokens 20000 --eval-tokens 2000 --emsize 16 --nhid 16 --bptt 10
    --batch-size 4 --progress off --eval-batches 2)

start_ps a
A=127.0.0.1:$PORT A_PID=$PS_PID
start_ps b
B=127.0.0.1:$PORT B_PID=$PS_PID

# ---- two models on one server -------------------------------------------------------
for m in left right; do
    "$TRAINER" --ps "$A" --model "$m" "${SMALL[@]}" --max-steps 5 2>"$TMP/$m.log" ||
        fail "--model $m: $(tail -3 "$TMP/$m.log")"
done
"$CTL" --ps "$A" modules >"$TMP/mods" || fail "ferry-ctl modules: $(cat "$TMP/mods")"
for name in left/encoder left/decoder right/encoder right/decoder; do
    grep -q "^  $name  " "$TMP/mods" || fail "no $name on the server: $(cat "$TMP/mods")"
done
ok "two models on one server: left/* and right/* listed ($(grep -c '^  ' "$TMP/mods") modules)"

# ---- a second run of a model: refused, or --continue ----------------------------------
expect_error "the same --model again" \
    "ferry-ps already holds 'left/encoder' (an earlier run's parameters): --continue" \
    "$TRAINER" --ps "$A" --model left "${SMALL[@]}" --max-steps 5
rc=0
"$TRAINER" --ps "$A" --model left "${SMALL[@]}" --max-steps 5 >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 1 ] || fail "a refused run exits $rc, want 1"
"$TRAINER" --ps "$A" --model left --continue "${SMALL[@]}" --max-steps 5 2>"$TMP/cont.log" ||
    fail "--continue: $(tail -3 "$TMP/cont.log")"
grep -q "continue: training from the parameters ferry-ps holds for 'left/encoder'" "$TMP/cont.log" ||
    fail "--continue says nothing: $(cat "$TMP/cont.log")"
"$CTL" --ps "$A" modules left >"$TMP/mods" || fail "ferry-ctl modules left"
grep -q "^  left/encoder .* version 10$" "$TMP/mods" ||
    fail "--continue did not train the held module (10 steps in all): $(cat "$TMP/mods")"
"$CTL" --ps "$A" drop left/encoder >/dev/null || fail "ferry-ctl drop left/encoder"
"$CTL" --ps "$A" drop left/decoder >/dev/null || fail "ferry-ctl drop left/decoder"
"$TRAINER" --ps "$A" --model left "${SMALL[@]}" --max-steps 2 2>"$TMP/again.log" ||
    fail "a new run after ferry-ctl drop: $(tail -3 "$TMP/again.log")"
ok "the same model again: refused (exit 1) naming --continue; --continue trained on to version 10; after ferry-ctl drop a new run starts"
expect_error "--model inside a job" "--model other: this run is job 'j'" \
    "$TRAINER" --ps "$A" --model other --job j --world 2 --rank 0 "${SMALL[@]}"
expect_error "--continue without --ps" "--continue needs --ps" \
    "$TRAINER" --local --continue "${SMALL[@]}"

# ---- a create that fails on one server leaves nothing on the other ------------------------
"$TRAINER" --ps "$B" --model mixed "${SMALL[@]}" --emsize 8 --nhid 8 --max-steps 1 \
    2>"$TMP/mixed8.log" || fail "mixed E=8 on b: $(tail -3 "$TMP/mixed8.log")"
expect_error "a model of another shape over a and b" "dims" \
    "$TRAINER" --ps "$A,$B" --model mixed "${SMALL[@]}" --max-steps 1
rc=0
"$CTL" --ps "$A" modules mixed >"$TMP/mods" 2>&1 || rc=$? # none to list may be an error
[ "$rc" -lt 128 ] || fail "ferry-ctl modules mixed on a: killed by signal $((rc - 128))"
grep -q "mixed/" "$TMP/mods" && fail "the failed create left shards on a: $(cat "$TMP/mods")"
"$CTL" --ps "$B" modules mixed >"$TMP/modsb" || fail "ferry-ctl modules on b"
grep -q "^  mixed/encoder  *embedding  *\[10000 x 8\]" "$TMP/modsb" ||
    fail "b's own module was touched: $(cat "$TMP/modsb")"
ok "a create refused by b (another shape) left nothing on a; b's module stands"

# ---- --save with --ps: says what it does, refused without --checkpoint-dir ----------------
expect_error "--save with --ps, no --checkpoint-dir" "has no --checkpoint-dir" \
    "$TRAINER" --ps "$A" --job s "${SMALL[@]}" --save "$TMP/s.ck" --max-steps 5
ls "$TMP"/s.ck* >/dev/null 2>&1 && fail "a refused --save left files: $(ls "$TMP"/s.ck*)"
stop_clean "$A_PID" "ferry-ps a" "$TMP/a.log"
stop_clean "$B_PID" "ferry-ps b" "$TMP/b.log"

# ---- the directories of job moves a kill left behind go at start-up, live ones stay -------
mkdir -p "$TMP/ck/.ferry-move.old123" "$TMP/ck/.ferry-move.new456" "$TMP/ck/.ferry-move.lnk789" \
    "$TMP/ck/.ferry-move.usr000"
printf 'mine' >"$TMP/ck/.ferry-move.usr000/notes.txt" # not a move's: the directory stays
printf 'FERRYPS3 partial' >"$TMP/ck/.ferry-move.old123/.export.ckpt.Ab12Cd" # killed mid-write
printf 'FERRYPS3 whole' >"$TMP/ck/.ferry-move.old123/export.ckpt"
printf 'keep' >"$TMP/outside"
ln -s "$TMP/outside" "$TMP/ck/.ferry-move.lnk789/adopt.ckpt"
touch -d '2 hours ago' "$TMP/ck/.ferry-move.old123" "$TMP/ck/.ferry-move.lnk789" \
    "$TMP/ck/.ferry-move.usr000"
start_ps c --checkpoint-dir "$TMP/ck"
C=127.0.0.1:$PORT C_PID=$PS_PID
[ ! -e "$TMP/ck/.ferry-move.old123" ] && [ ! -e "$TMP/ck/.ferry-move.lnk789" ] ||
    fail "stale move directories stayed: $(ls -a "$TMP/ck")"
[ -d "$TMP/ck/.ferry-move.new456" ] || fail "a fresh move directory (a live move's) was removed"
[ "$(cat "$TMP/outside")" = keep ] || fail "the sweep followed a link out of its directory"
[ "$(cat "$TMP/ck/.ferry-move.usr000/notes.txt" 2>/dev/null)" = mine ] ||
    fail "the sweep removed a file a move does not write"
grep -q "left $TMP/ck/.ferry-move.usr000, .*: it holds files a move does not write" "$TMP/c.log" ||
    fail "the sweep did not say why it left a directory: $(cat "$TMP/c.log")"
grep -q "removed 2 directories of job moves a kill interrupted" "$TMP/c.log" ||
    fail "the sweep did not say what it removed: $(cat "$TMP/c.log")"
ok "start-up removed the two move directories a kill left (one with a link: not followed), kept a fresh one and one holding another file (logged)"
"$TRAINER" --ps "$C" --job fin "${SMALL[@]}" --save "$TMP/fin.ck" --max-steps 6 \
    2>"$TMP/fin.log" || fail "--save with --ps: $(tail -3 "$TMP/fin.log")"
grep -q "save with --ps: this run is job 'fin' of one rank" "$TMP/fin.log" ||
    fail "--save with --ps does not say what it does: $(cat "$TMP/fin.log")"
ls "$TMP"/ck/fin-step*.ckpt >/dev/null || fail "no server checkpoint: $(ls "$TMP/ck")"
ok "--save with --ps: said it runs job 'fin' of one rank; server file $(basename "$(ls "$TMP"/ck/fin-step*.ckpt | tail -1)")"

# ---- a finished job continues with --load ---------------------------------------------------
"$TRAINER" --ps "$C" --load "$TMP/fin.ck" --max-steps 9 2>"$TMP/load.log" ||
    fail "--load of the finished job: $(tail -5 "$TMP/load.log")"
grep -q "the job rolled back to step 6 " "$TMP/load.log" || fail "--load did not resume at step 6: $(cat "$TMP/load.log")"
grep -q "done: 9 steps" "$TMP/load.log" || fail "--load did not go on to step 9: $(tail -3 "$TMP/load.log")"
ok "a finished job continued with --load: resumed at step 6, done at step 9, no ferry-ps restart"
stop_clean "$C_PID" "ferry-ps c" "$TMP/c.log"
finish
