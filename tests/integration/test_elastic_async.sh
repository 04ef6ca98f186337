#!/usr/bin/env bash
# Elastic ssp and async jobs (--elastic MIN:MAX --sync ssp:K|async), end to end on 2
# ferry-ps. They have no common step, so no boundary: a trainer is admitted at once at
# the members' least step, keeps its own columns [r*b, (r+1)*b) of MAX x b (the per-rank
# policy, their default) and their carried state, and one that leaves (SIGTERM) or
# dies (SIGKILL) stops counting for the staleness bound at once.
#
# - Against fixed worlds: an elastic async job of one member is the fixed world-2
#   async job whose rank 1 never came (every step's loss within 1e-5); an elastic
#   ssp:0 job whose 2 members are there throughout trains as the fixed world-2 ssp:0
#   job (ssp orders replies, not reads, so two runs differ by timing: within 1% over
#   the last 50 steps).
# - ssp:2 going 2 -> 3 -> 2 -> 1 (a third trainer started, it leaves by SIGTERM, then
#   one killed by SIGKILL): no roll-back and no redo; the third starts at the members'
#   steps, not at 1; the coordinator's memberships are 2, 3, 2, 1; the bound held
#   (max_lead <= 2) throughout; the survivor's next step after the kill comes within
#   a second or two (reported), and it finishes the run with a falling loss.
# - Refusals: --elastic-batch global with async; moving an async job's servers.
. "$(dirname "$0")/lib.sh"
DATA=(--data "$FERRY_SRC/data/ptb" --train-tokens 120000 --eval-tokens 400 --epochs 1
    --emsize 32 --nhid 32 --bptt 10 --seed 7 --lr 0.1 --dropout 0.2
    --log-interval 1 --progress off --deadline-ms 10000 --sync-timeout 60)
STEPS=200
LONG=1500 # the ssp:2 run's: room for the changes below on a slow machine
STATS=$FERRY_BIN/tests/ferry_stats
CTL=$FERRY_BIN/server/ferry-ctl

start_ps p0
P0=$PORT
start_ps p1
P1=$PORT
PSL=127.0.0.1:$P0,127.0.0.1:$P1

expect_error "--elastic-batch global with --sync async" "needs --sync bsp" "$TRAINER" \
    "${DATA[@]}" --batch-size 2 --ps "$PSL" --job g --elastic 1:2 --sync async \
    --elastic-batch global --max-steps 5

# ---- against fixed worlds ----
pids=()
for r in 0 1; do
    "$TRAINER" "${DATA[@]}" --batch-size 4 --ps "$PSL" --max-steps "$STEPS" --job ref --world 2 \
        --rank "$r" --sync ssp:0 --metrics-out "$TMP/ref$r.jsonl" 2>"$TMP/ref$r.log" &
    pids+=($!)
done
for r in 0 1; do wait "${pids[$r]}" || fail "fixed ssp:0 rank $r: $(tail -3 "$TMP/ref$r.log")"; done
pids=()
for r in 0 1; do
    "$TRAINER" "${DATA[@]}" --batch-size 2 --ps "$PSL" --max-steps "$STEPS" --job el0 \
        --elastic 2:2 --sync ssp:0 --metrics-out "$TMP/el0.$r.jsonl" 2>"$TMP/el0.$r.log" &
    pids+=($!)
done
for r in 0 1; do wait "${pids[$r]}" || fail "elastic ssp:0 trainer $r: $(tail -3 "$TMP/el0.$r.log")"; done
grep -q "elastic, rank [01] (picked) of 2..2 members, --sync ssp:0, per-rank batch" \
    "$TMP/el0.0.log" || fail "no ssp per-rank line: $(grep -m1 elastic "$TMP/el0.0.log")"
"$TRAINER" "${DATA[@]}" --batch-size 4 --ps "$PSL" --max-steps "$STEPS" --job refa --world 2 \
    --rank 0 --sync async --metrics-out "$TMP/refa.jsonl" 2>"$TMP/refa.log" ||
    fail "fixed async rank 0 alone: $(tail -3 "$TMP/refa.log")"
"$TRAINER" "${DATA[@]}" --batch-size 2 --ps "$PSL" --max-steps "$STEPS" --job ela --elastic 1:2 \
    --sync async --metrics-out "$TMP/ela.jsonl" 2>"$TMP/ela.log" ||
    fail "elastic async alone: $(tail -3 "$TMP/ela.log")"
python3 - "$TMP" "$STEPS" <<'EOF' || fail "elastic ssp:0 and async against fixed worlds"
import json, sys
tmp, steps = sys.argv[1], int(sys.argv[2])
def losses(name):
    return {e["step"]: e["loss"] for e in map(json.loads, open(f"{tmp}/{name}.jsonl"))
            if e["event"] == "train"}
# ssp lets a rank's forward see another's update of the same step or not (the bound
# holds replies, not reads), so two runs of 2 ranks differ in summation order and
# timing: the elastic job must train as the fixed one does, to 1% over the last 50
# steps of both ranks, and take every step.
def tail(names):
    l = [losses(n) for n in names]
    if any(len(x) != steps for x in l):
        sys.exit(f"{names}: {[len(x) for x in l]} steps, want {steps}")
    return sum(x[s] for x in l for s in range(steps - 49, steps + 1)) / (50 * len(l))
ref, el = tail(["ref0", "ref1"]), tail(["el0.0", "el0.1"])
if abs(el - ref) > 0.01 * ref:
    sys.exit(f"elastic ssp:0 ends at loss {el:.4f}, the fixed world at {ref:.4f}")
a, ra = losses("ela"), losses("refa")
d = max(abs(l - ra[s]) for s, l in a.items())
if len(a) != steps or d > 1e-5:
    sys.exit(f"elastic async alone: {len(a)} steps, {d:.3g} from rank 0 of a fixed world of 2")
print(f"ssp:0: last 50 steps at {el:.4f} against {ref:.4f}; async alone: {steps} steps "
      f"within {d:.2g} of the fixed world")
EOF
ok "elastic ssp:0 (2 members) trains as the fixed world; async (1 member) is its fixed world step for step"

# ---- ssp:2, 2 -> 3 -> 2 -> 1 ----
EL=(--batch-size 2 --ps "$PSL" --max-steps "$LONG" --sync ssp:2 --elastic 1:3 --job move)
"$TRAINER" "${DATA[@]}" "${EL[@]}" --metrics-out "$TMP/a.jsonl" 2>"$TMP/a.log" &
A=$!
wait_until "the first trainer to be admitted" 60 logged "$TMP/a.log" "admitted" "$A"
"$TRAINER" "${DATA[@]}" "${EL[@]}" --metrics-out "$TMP/b.jsonl" 2>"$TMP/b.log" &
B=$!
wait_until "step 60 of the first" 120 at_least "$TMP/a.jsonl" "$A" 60
"$TRAINER" "${DATA[@]}" "${EL[@]}" --metrics-out "$TMP/c.jsonl" 2>"$TMP/c.log" &
C=$!
wait_until "the third trainer to train" 120 logged "$TMP/c.jsonl" '"event":"train"' "$C"
first_c=$(grep -m1 '"event":"train"' "$TMP/c.jsonl" | sed 's/.*"step":\([0-9]*\),.*/\1/')
[ "$first_c" -gt 50 ] || fail "the third trainer started at step $first_c, not at the members'"
wait_until "the third trainer's 40th step" 120 at_least "$TMP/c.jsonl" "$C" "$((first_c + 40))"
# The bound counts it: while it is stopped, the others go at most K = 2 steps past it
# (and one more: its last Step may be applied, its train event not yet written).
kill -STOP "$C"
c_at=$(last_step "$TMP/c.jsonl")
sleep 1.5
a_at=$(last_step "$TMP/a.jsonl")
b_at=$(last_step "$TMP/b.jsonl")
kill -CONT "$C"
[ "$a_at" -le $((c_at + 3)) ] && [ "$b_at" -le $((c_at + 3)) ] ||
    fail "ssp:2 with the third trainer stopped at step $c_at: the others reached $a_at and $b_at"
stop_clean "$C" "the third trainer (SIGTERM)" "$TMP/c.log"
at=$(last_step "$TMP/b.jsonl")
wait_until "20 more steps of the second" 120 at_least "$TMP/b.jsonl" "$B" "$((at + 20))"
before=$(last_step "$TMP/a.jsonl")
kill -9 "$B"
t_kill=$(date +%s.%N)
reap_killed "$B" "the second trainer (SIGKILL)"
wait_until "the first trainer's next step after the kill" 30 at_least "$TMP/a.jsonl" "$A" \
    "$((before + 3))"
t_next=$(date +%s.%N)
wait "$A" || fail "the first trainer: $(tail -3 "$TMP/a.log")"
lead=$("$STATS" "127.0.0.1:$P0" job/move/max_lead | awk '{print $2}')
[ -n "$lead" ] && [ "${lead%.*}" -le 2 ] || fail "ssp:2 bound: max_lead $lead"
for f in a b c; do
    ! grep -q '"event":"recover"\|"event":"redo"' "$TMP/$f.jsonl" || fail "$f: a roll-back or redo"
done
sizes=$(grep "job 'move': membership epoch" "$TMP/p0.log" |
    sed 's/.*(\([0-9]*\) of 1..3).*/\1/' | uniq | tr '\n' ' ')
case "$sizes" in
*"2 3 2 1 "*) ;;
*) fail "the coordinator's memberships: $sizes (want 2, 3, 2, 1 in turn)" ;;
esac
python3 - "$TMP" "$LONG" <<'EOF' || fail "the survivor's losses and memberships"
import json, sys
ev = list(map(json.loads, open(f"{sys.argv[1]}/a.jsonl")))
l = [e["loss"] for e in ev if e["event"] == "train"]
# it asks the coordinator at each log line (every step here): it saw every change
seen = [e["members"] for e in ev if e["event"] == "membership"]
seen = [n for i, n in enumerate(seen) if i == 0 or n != seen[i - 1]]
if seen != [1, 2, 3, 2, 1]:
    sys.exit(f"the survivor saw memberships {seen}, want [1, 2, 3, 2, 1]")
head, tail = sum(l[:30]) / 30, sum(l[-30:]) / 30
if len(l) != int(sys.argv[2]) or not tail < head - 0.3:
    sys.exit(f"{len(l)} steps, loss {head:.3f} -> {tail:.3f}")
print(f"survivor: {len(l)} steps, loss {head:.3f} -> {tail:.3f}")
EOF
ok "ssp:2 went 2 -> 3 -> 2 -> 1 (memberships $sizes), third started at step $first_c and held the others at $a_at, $b_at while stopped at $c_at, max_lead $lead, next step $(python3 -c "print(f'{$t_next - $t_kill:.2f}')") s after the kill"

# ---- moving an async job's servers is refused ----
start_ps p2
P2=$PORT
"$TRAINER" "${DATA[@]}" --batch-size 2 --ps "$PSL" --max-steps 100000 --sync async \
    --elastic 1:2 --job held --metrics-out "$TMP/h.jsonl" 2>"$TMP/h.log" &
H=$!
wait_until "the async trainer to train" 60 logged "$TMP/h.jsonl" '"event":"train"' "$H"
expect_error "moving an async job's servers" "only an elastic bsp job has" "$CTL" --ps "$PSL" \
    --to "$PSL,127.0.0.1:$P2" resize held
stop_clean "$H" "the async trainer (SIGTERM)" "$TMP/h.log"
finish
