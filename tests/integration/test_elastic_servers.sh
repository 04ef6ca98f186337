#!/usr/bin/env bash
# Servers join and leave a running elastic job (ferry-ctl resize), end to end.
#
# - An elastic job of 2 trainers runs on 2 ferry-ps; mid-run `ferry-ctl resize` moves
#   it to 3 servers (a third ferry-ps started for it), later to 2 again (`ferry-ctl drain`
#   of the second server). Every step's loss, as both trainers logged it, is within 1e-5 of
#   the same step of an undisturbed 2-trainer job on 2 servers with the same global
#   batch. Nothing rolls back; each move's bytes and seconds are reported by ferry-ctl,
#   the coordinator's log and /metrics; the trainers' metrics say when they followed;
#   the drained server no longer holds the job or its modules, and the new one does.
#   A third trainer started afterwards with the job's first --ps (the drained server
#   in it) is sent to the job's servers now, admitted, and trains on with the same
#   losses.
# - Refusals, each in one line, with the job going on: a --to whose first server is
#   not the coordinator, a job that is not elastic, a move to a server that is not
#   there; and a move to a server the members cannot reach is called off after
#   --timeout, the members go back, and the job goes on (its losses still the
#   undisturbed job's).
. "$(dirname "$0")/lib.sh"
DATA=(--data "$FERRY_SRC/data/ptb" --train-tokens 120000 --eval-tokens 400 --epochs 1
    --emsize 32 --nhid 32 --bptt 10 --batch-size 6 --seed 7 --lr 0.1 --dropout 0.2
    --log-interval 1 --progress off
    --deadline-ms 10000 --sync-timeout 30)
STEPS=600
CTL=$FERRY_BIN/server/ferry-ctl

start_ps ref0
R0=$PORT
start_ps ref1
R1=$PORT
start_ps s0 --metrics-listen 127.0.0.1:0
S0=$PORT
start_ps s1
S1=$PORT S1PID=$PS_PID
start_ps s2
S2=$PORT
REF=(--ps "127.0.0.1:$R0,127.0.0.1:$R1" --max-steps "$STEPS")
TWO=127.0.0.1:$S0,127.0.0.1:$S1
THREE=127.0.0.1:$S0,127.0.0.1:$S1,127.0.0.1:$S2
BACK=127.0.0.1:$S0,127.0.0.1:$S2

# ---- the undisturbed job: 2 trainers, 2 servers, global batch 6 ----
"$TRAINER" "${DATA[@]}" "${REF[@]}" --job ref --world 2 --rank 0 --metrics-out "$TMP/ref0.jsonl" \
    2>"$TMP/ref0.log" &
A=$!
"$TRAINER" "${DATA[@]}" "${REF[@]}" --job ref --world 2 --rank 1 2>"$TMP/ref1.log" &
B=$!
wait "$A" || fail "reference rank 0: $(tail -3 "$TMP/ref0.log")"
wait "$B" || fail "reference rank 1: $(tail -3 "$TMP/ref1.log")"
[ "$(train_losses "$TMP/ref0.jsonl" | wc -l)" -eq "$STEPS" ] || fail "reference: not $STEPS steps"
ok "undisturbed job of 2 trainers on 2 servers, $STEPS steps"

expect_error "resize of a job that is not elastic" "is not elastic" "$CTL" --ps "127.0.0.1:$R0" \
    --to "127.0.0.1:$R0,127.0.0.1:$R1" --timeout 5 resize ref

# ---- the elastic job: servers 2 -> 3 -> 2 ----
EL=(--ps "$TWO" --max-steps "$STEPS" --job el --elastic 2:3)
"$TRAINER" "${DATA[@]}" "${EL[@]}" --metrics-out "$TMP/a.jsonl" 2>"$TMP/a.log" &
A=$!
"$TRAINER" "${DATA[@]}" "${EL[@]}" --metrics-out "$TMP/b.jsonl" 2>"$TMP/b.log" &
B=$!
wait_until "the elastic job to reach step 60" 300 at_least "$TMP/a.jsonl" "$A" 60

expect_error "resize that moves the coordinator" "stays first" "$CTL" --ps "$TWO" \
    --to "127.0.0.1:$S1,127.0.0.1:$S0" resize el
# A server that is not there: the members cannot join it; the move is called off.
DEAD=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
expect_error "resize to a server that is not there" "connect" "$CTL" --ps "$TWO" \
    --to "$TWO,127.0.0.1:$DEAD" --timeout 5 resize el
# A server only ferry-ctl reaches (a proxy that takes one connection): the members
# cannot join it, so the move is called off after --timeout and they go back.
start_ps s3
CUT_PROXY_ACCEPT=1 python3 "$FERRY_SRC/tests/integration/cut-proxy.py" "$TMP/proxy.port" "$PORT" &
PROXY=$!
wait_until "the proxy's port" 30 test -s "$TMP/proxy.port"
expect_error "resize to a server the members cannot reach" "called off" "$CTL" --ps "$TWO" \
    --to "$TWO,127.0.0.1:$(cat "$TMP/proxy.port")" --timeout 3 resize el
kill "$PROXY"
at=$(last_step "$TMP/a.jsonl")
wait_until "the job to go on after the refusals" 120 at_least "$TMP/a.jsonl" "$A" "$((at + 10))"
grep -q "the move of its servers to .* is called off" "$TMP/s0.log" ||
    fail "the coordinator did not log the call-off"

"$CTL" --ps "$TWO" --to "$THREE" resize el >"$TMP/grow.out" 2>&1 ||
    fail "resize 2 -> 3: $(cat "$TMP/grow.out")"
grep -q "2 -> 3 servers" "$TMP/grow.out" || fail "resize 2 -> 3 said: $(cat "$TMP/grow.out")"
at=$(last_step "$TMP/a.jsonl")
wait_until "the job to train on 3 servers" 120 at_least "$TMP/a.jsonl" "$A" "$((at + 100))"
"$CTL" --ps "$THREE" modules el/ >"$TMP/mods3.out" 2>&1 || fail "modules: $(cat "$TMP/mods3.out")"
[ "$(grep -c "el/" "$TMP/mods3.out")" -ge 6 ] || fail "3 servers' modules: $(cat "$TMP/mods3.out")"

expect_error "resize naming servers the job left" "runs on other servers than --ps says" \
    "$CTL" --ps "$TWO" --to "$BACK" resize el
expect_error "drain of the coordinator" "after its first server" "$CTL" --ps "$THREE" \
    drain el "127.0.0.1:$S0"
"$CTL" --ps "$THREE" drain el "127.0.0.1:$S1" >"$TMP/drain.out" 2>&1 ||
    fail "drain 3 -> 2: $(cat "$TMP/drain.out")"
grep -q "3 -> 2 servers" "$TMP/drain.out" || fail "resize 3 -> 2 said: $(cat "$TMP/drain.out")"
# A trainer started with the job's first --ps (the drained server in it) is sent to
# the servers the job runs on now, and admitted there.
"$TRAINER" "${DATA[@]}" "${EL[@]}" --metrics-out "$TMP/c.jsonl" 2>"$TMP/c.log" &
C=$!
wait "$A" || fail "trainer a: $(tail -3 "$TMP/a.log")"
wait "$B" || fail "trainer b: $(tail -3 "$TMP/b.log")"
wait "$C" || fail "trainer c: $(tail -3 "$TMP/c.log")"
ok "elastic job ran $STEPS steps while its servers went 2 -> 3 -> 2"
echo "  $(tail -1 "$TMP/grow.out")"
echo "  $(tail -1 "$TMP/drain.out")"

for f in a b c; do
    ! grep -q '"event":"recover"' "$TMP/$f.jsonl" || fail "$f: a recover event (a roll-back)"
    ! grep -q 'rolled back' "$TMP/$f.log" || fail "$f: $(grep -m1 'rolled back' "$TMP/$f.log")"
    [ "$f" = c ] || [ "$(grep -c '"event":"servers"' "$TMP/$f.jsonl")" -eq 3 ] ||
        fail "$f: not 3 servers events: $(grep '"event":"servers"' "$TMP/$f.jsonl")"
done
grep -q "elastic: servers $BACK (move 2" "$TMP/c.log" ||
    fail "trainer c was not sent to the job's servers: $(grep -m3 servers "$TMP/c.log")"
ok "no roll-back; both trainers followed both moves, the third went where the job is"

python3 - "$TMP" "$STEPS" <<'EOF' || fail "elastic job against the undisturbed one"
import json, sys
tmp, steps = sys.argv[1], int(sys.argv[2])
def events(name):
    return [json.loads(line) for line in open(f"{tmp}/{name}.jsonl")]
ref = {e["step"]: e["loss"] for e in events("ref0") if e["event"] == "train"}
worst, logged, shown = 0.0, 0, []
for name in "abc":
    ev = events(name)
    got = sorted(e["step"] for e in ev if e["event"] == "train")
    first = 1 if name != "c" else got[0]
    if name == "c" and (len(got) < 10 or first < 2):
        sys.exit(f"trainer c logged steps {got[:3]}..: not admitted after the moves")
    if got != list(range(first, steps + 1)):
        sys.exit(f"trainer {name} logged {len(got)} steps, not {first}..{steps}")
    for e in ev:
        if e["event"] == "train":
            worst = max(worst, abs(e["loss"] - ref[e["step"]]))
            logged += 1
    moves = [(e["step"], e["servers"]) for e in ev if e["event"] == "servers"]
    shown = moves if name == "a" else shown
    want = [2, 3, 2] if name != "c" else [] # c followed before its metrics opened
    if [m[1] for m in moves] != want:
        sys.exit(f"trainer {name} followed moves {moves}, want {want} servers")
if worst > 1e-5:
    sys.exit(f"a step's loss is {worst:.3g} from the undisturbed job's (more than 1e-5)")
print(f"  max |loss - undisturbed| over {logged} logged steps: {worst:.2e}; moves (the first "
      f"called off) after steps {[m[0] for m in shown]}")
EOF
ok "every step within 1e-5 of the undisturbed job"

# The coordinator's log and /metrics, the servers' modules now.
grep -q "job 'el': servers 127.0.0.1:$S0,127.0.0.1:$S2 from step" "$TMP/s0.log" ||
    fail "the coordinator did not log the second move"
MPORT=$(sed -n 's/.*metrics on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/s0.log" | head -1)
curl -sf "http://127.0.0.1:$MPORT/metrics" >"$TMP/s0.metrics" || fail "no /metrics on s0"
grep -q 'servers_epoch.* 2$' "$TMP/s0.metrics" ||
    fail "/metrics: $(grep -i servers_epoch "$TMP/s0.metrics")"
grep -q 'last_move_bytes.* [1-9]' "$TMP/s0.metrics" ||
    fail "/metrics: $(grep -i last_move "$TMP/s0.metrics")"
"$CTL" --ps "127.0.0.1:$S1" modules el/ >"$TMP/mods1.out" 2>&1 || fail "modules on s1"
! grep -q "el/" "$TMP/mods1.out" || fail "the drained server holds: $(cat "$TMP/mods1.out")"
"$CTL" --ps "127.0.0.1:$S2" modules el/ >"$TMP/mods2.out" 2>&1 || fail "modules on s2"
grep -q "el/" "$TMP/mods2.out" || fail "the new server holds nothing of the job"
kill -0 "$S1PID" || fail "the drained ferry-ps exited"
"$CTL" --ps "$BACK" job el >"$TMP/job.out" 2>&1 || fail "ferry-ctl job el: $(cat "$TMP/job.out")"
grep -q "^servers: $BACK (after 2 moves)" "$TMP/job.out" ||
    fail "ferry-ctl job el shows no servers: $(cat "$TMP/job.out")"
ok "moves in the coordinator's log, /metrics and ferry-ctl job; the drained server holds nothing of the job"
finish
