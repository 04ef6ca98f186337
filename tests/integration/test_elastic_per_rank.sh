#!/usr/bin/env bash
# The per-rank batch policy of an elastic job (--elastic-batch per-rank), end to end on
# 2 ferry-ps: each rank r trains its own columns [r*b, (r+1)*b) of MAX x b (b =
# --batch-size), whatever the membership, and the learning rate scales with the
# members (the loss is scaled by the whole MAX x b batch: a step is lr x members/MAX
# times the mean gradient over the members' columns).
#
# - With every rank present (--elastic 3:3), the job is the fixed-world job of 3 ranks
#   with --batch-size 3b: every step's loss within 1e-5.
# - A job of --elastic 1:3 goes 2 -> 3 -> 2 trainers (the third joins, then leaves by
#   SIGTERM): no roll-back; the members keep their own columns through every change;
#   the steps before the third joins are the steps of a job whose third rank never came
#   (within 1e-5), and after it joined they are not (its columns count then); the
#   third trainer's columns start from zero state and it trains at the job's window.
# - Bad set-ups are refused in one line each.
. "$(dirname "$0")/lib.sh"
DATA=(--data "$FERRY_SRC/data/ptb" --train-tokens 120000 --eval-tokens 400 --epochs 1
    --emsize 32 --nhid 32 --bptt 10 --seed 7 --lr 0.1 --dropout 0.2
    --log-interval 1 --progress off --deadline-ms 10000 --sync-timeout 60)
STEPS=300

start_ps p0
P0=$PORT
start_ps p1
P1=$PORT
PSL=127.0.0.1:$P0,127.0.0.1:$P1

expect_error "--elastic-batch without --elastic" "is the batch policy of an elastic job" \
    "$TRAINER" "${DATA[@]}" --batch-size 2 --ps "$PSL" --elastic-batch per-rank --max-steps 5
expect_error "--elastic-batch per-rank too wide" "more than 1048576 columns" "$TRAINER" \
    "${DATA[@]}" --batch-size 600000 --ps "$PSL" --job w --elastic 1:2 --elastic-batch per-rank \
    --max-steps 5

# ---- the fixed world of 3, batch 6 ----
pids=()
for r in 0 1 2; do
    "$TRAINER" "${DATA[@]}" --batch-size 6 --ps "$PSL" --max-steps "$STEPS" --job ref --world 3 \
        --rank "$r" --metrics-out "$TMP/ref$r.jsonl" 2>"$TMP/ref$r.log" &
    pids+=($!)
done
for r in 0 1 2; do wait "${pids[$r]}" || fail "reference rank $r: $(tail -3 "$TMP/ref$r.log")"; done
ok "fixed world of 3 trainers, batch 6, $STEPS steps"

# ---- per-rank, every rank present ----
EL=(--batch-size 2 --ps "$PSL" --max-steps "$STEPS" --elastic-batch per-rank)
pids=()
for r in 0 1 2; do
    "$TRAINER" "${DATA[@]}" "${EL[@]}" --job full --elastic 3:3 --metrics-out "$TMP/f$r.jsonl" \
        2>"$TMP/f$r.log" &
    pids+=($!)
done
for r in 0 1 2; do wait "${pids[$r]}" || fail "per-rank trainer $r: $(tail -3 "$TMP/f$r.log")"; done
grep -q "per-rank batch: columns \[[024], [246]) of 6" "$TMP/f0.log" ||
    fail "no per-rank columns in the log: $(grep -m1 "elastic" "$TMP/f0.log")"

# ---- per-rank, 2 -> 3 -> 2, and 2 throughout ----
for job in two moved; do
    "$TRAINER" "${DATA[@]}" "${EL[@]}" --job "$job" --elastic 2:3 \
        --metrics-out "$TMP/$job.a.jsonl" 2>"$TMP/$job.a.log" &
    A=$!
    "$TRAINER" "${DATA[@]}" "${EL[@]}" --job "$job" --elastic 2:3 \
        --metrics-out "$TMP/$job.b.jsonl" 2>"$TMP/$job.b.log" &
    B=$!
    if [ "$job" = moved ]; then
        wait_until "step 60" 120 at_least "$TMP/$job.a.jsonl" "$A" 60
        "$TRAINER" "${DATA[@]}" "${EL[@]}" --job "$job" --elastic 2:3 \
            --metrics-out "$TMP/$job.c.jsonl" 2>"$TMP/$job.c.log" &
        C=$!
        wait_until "the third trainer to train" 120 logged "$TMP/$job.c.jsonl" '"event":"train"' "$C"
        at=$(last_step "$TMP/$job.c.jsonl")
        wait_until "the third trainer's 40th step" 120 at_least "$TMP/$job.c.jsonl" "$C" "$((at + 40))"
        stop_clean "$C" "the third trainer (SIGTERM)" "$TMP/$job.c.log"
    fi
    wait "$A" || fail "$job a: $(tail -3 "$TMP/$job.a.log")"
    wait "$B" || fail "$job b: $(tail -3 "$TMP/$job.b.log")"
done
for f in two.a two.b moved.a moved.b moved.c; do
    ! grep -q '"event":"recover"\|"event":"redo"' "$TMP/$f.jsonl" || fail "$f: a roll-back or redo"
done
# A trainer of the other policy is refused at join (the policy is part of the model).
"$TRAINER" "${DATA[@]}" "${EL[@]}" --job mix --elastic 2:3 2>"$TMP/mix.log" &
MIX=$!
wait_until "the per-rank trainer of job mix to wait for a second" 60 logged "$TMP/mix.log" \
    "asks to join" "$MIX"
expect_error "a global-batch trainer joining a per-rank job" "rank_columns" "$TRAINER" \
    "${DATA[@]}" --batch-size 6 --ps "$PSL" --max-steps 5 --job mix --elastic 2:3
kill -9 "$MIX"
reap_killed "$MIX" "job mix's trainer"
grep -q "per-rank batch: columns \[4, 6) of 6" "$TMP/moved.c.log" ||
    fail "the third trainer's columns: $(grep -m1 "per-rank" "$TMP/moved.c.log")"

python3 - "$TMP" "$STEPS" <<'EOF' || fail "per-rank jobs against their references"
import json, sys
tmp, steps = sys.argv[1], int(sys.argv[2])
def ev(name):
    return [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")]
def losses(name):
    return {e["step"]: e["loss"] for e in ev(name) if e["event"] == "train"}
ref = losses("ref0")
full = [max(abs(l - ref[s]) for s, l in losses(f"f{r}").items()) for r in range(3)]
if max(full) > 1e-5 or len(losses("f0")) != steps:
    sys.exit(f"every rank present: {max(full):.3g} from the fixed world of 3 (over 1e-5)")
two, moved, c = losses("two.a"), losses("moved.a"), losses("moved.c")
joined = min(c)
before = max(abs(moved[s] - two[s]) for s in range(1, joined))
after = max(abs(moved[s] - two[s]) for s in range(joined, max(c) + 1))
if before > 1e-5:
    sys.exit(f"before the third joined: {before:.3g} from the job whose third never came")
if after < 1e-4:
    sys.exit(f"the third member's columns did not count ({after:.3g} from the 2-member job)")
sizes = [e["members"] for e in ev("moved.a") if e["event"] == "membership"]
if sizes != [2, 3, 2]:
    sys.exit(f"memberships {sizes}, want [2, 3, 2]")
# Each member's columns are its rank's through every change: [2r, 2r + 2).
for name in ("moved.a", "moved.b", "moved.c"):
    cols = {(e["col0"], e["col1"]) for e in ev(name) if e["event"] == "membership"}
    if len(cols) != 1 or any(c1 - c0 != 2 or c0 % 2 for c0, c1 in cols):
        sys.exit(f"{name}'s columns moved: {sorted(cols)}")
if {(e["col0"], e["col1"]) for e in ev("moved.c") if e["event"] == "membership"} != {(4, 6)}:
    sys.exit("the third trainer did not take rank 2's columns [4, 6)")
lrs = {e["lr"] for e in ev("moved.a") if e["event"] == "train"}
if lrs != {0.100000001}:
    sys.exit(f"lr {sorted(lrs)}: the rule scales the step through the loss, not the lr")
print(f"  all present: {max(full):.2e} from the fixed world of 3; 2 -> 3 -> 2: steps "
      f"1..{joined - 1} {before:.2e} from 2 throughout, then {after:.3f} (the third's columns "
      f"count); lr {sorted(lrs)} as given (the rule scales it through the loss)")
EOF
ok "per-rank: every rank present is the fixed world; the third's joining and leaving change the steps, no roll-back"
finish
