#!/usr/bin/env bash
# Many trainers, real processes on 127.0.0.1: a bsp job of 2 ferry-trainer x batch 10
# through 2 ferry-ps (ranks from the flags, from FERRY_RANK/FERRY_WORLD and from
# Slurm's variables) logs the losses of one local trainer with batch 20 (each of 30
# steps within 1e-5 relative, at the metrics file's 9 digits); ssp:1 never
# lets a rank run more than the bound ahead while the other is stopped (SIGSTOP), the
# steps read from the servers; async trains with both ranks finishing; a new run of
# a finished job is refused the modules the earlier run left; bad membership gets one
# clear line each while the servers keep serving; a bsp rank that never comes makes
# the other fail naming it.
# Every process's exit status is checked (the servers: 0 on SIGTERM at the end).
. "$(dirname "$0")/lib.sh"
STATS=$FERRY_BIN/tests/ferry_stats

start_ps ps0 --shutdown-grace-ms 500
P0=$PORT Q0=$PS_PID
start_ps ps1 --shutdown-grace-ms 500
P1=$PORT Q1=$PS_PID
PSS="127.0.0.1:$P0,127.0.0.1:$P1"
DATA=(--data "$FERRY_SRC/data/ptb" --train-tokens 60000 --eval-tokens 4000 --epochs 1
    --batch-size 20 --log-interval 1 --lr 0.1)

# losses FILE: "step loss" per train event.
losses() { grep '"event":"train"' "$1" | sed 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/'; }

# ---- bsp: 2 x 10 == 1 x 20 ------------------------------------------------------
"$TRAINER" --local "${DATA[@]}" --max-steps 30 --metrics-out "$TMP/local.jsonl" 2>"$TMP/local.log" ||
    fail "local trainer: $(tail -3 "$TMP/local.log")"
FERRY_RANK=1 FERRY_WORLD=2 "$TRAINER" --ps "$PSS" --job bsp "${DATA[@]}" --max-steps 30 \
    --metrics-out "$TMP/r1.jsonl" 2>"$TMP/r1.log" &
R1=$!
SLURM_PROCID=0 SLURM_NTASKS=2 "$TRAINER" --ps "$PSS" --job bsp "${DATA[@]}" --max-steps 30 \
    --metrics-out "$TMP/r0.jsonl" 2>"$TMP/r0.log" || fail "rank 0: $(tail -3 "$TMP/r0.log")"
wait "$R1" || fail "rank 1: $(tail -3 "$TMP/r1.log")"
grep -q "rank 0 of 2 (rank 0 from SLURM_PROCID, world 2 from SLURM_NTASKS)" "$TMP/r0.log" ||
    fail "rank 0 did not take its rank from Slurm: $(grep job "$TMP/r0.log")"
grep -q "rank 1 of 2 (rank 1 from FERRY_RANK, world 2 from FERRY_WORLD)" "$TMP/r1.log" ||
    fail "rank 1 did not take its rank from FERRY_*"
same_listing "the ranks' losses" "$(losses "$TMP/r0.jsonl")" "$(losses "$TMP/r1.jsonl")" 30
worst=$(join <(losses "$TMP/local.jsonl") <(losses "$TMP/r0.jsonl") |
    awk '{ r = ($2 - $3) / $2; if (r < 0) r = -r; if (r > w) w = r; n++ }
         END { if (n != 30) print "n=" n; else printf "%.3g\n", w }')
awk -v w="$worst" 'BEGIN { exit !(w + 0 <= 1e-5 && w !~ /n=/) }' ||
    fail "bsp job vs local trainer: worst relative loss difference $worst over 30 steps"
ok "bsp: 2 trainers x batch 10 log the losses of 1 trainer x batch 20 (worst rel $worst)"
applied=$("$STATS" "127.0.0.1:$P1" job/bsp/applied | awk '{print $2}')
[ "$applied" = 30 ] || fail "server 1 applied $applied bsp steps, want 30"
ok "bsp: each server applied 30 steps, once each"

# ---- ssp:1 with one rank stopped --------------------------------------------------
K=1
SSP=(--ps "$PSS" --job ssp --world 2 --sync "ssp:$K" --sync-timeout 60 "${DATA[@]}"
    --max-steps 60 --log-interval 10)
"$TRAINER" "${SSP[@]}" --rank 0 2>"$TMP/s0.log" &
S0=$!
"$TRAINER" "${SSP[@]}" --rank 1 2>"$TMP/s1.log" &
S1=$!
step_of() { "$STATS" "127.0.0.1:$P0" "job/ssp/step/$1" | awk '{print $2}'; }
rank1_at_5() {
    local s
    s=$(step_of 1 2>/dev/null) || s=0
    [ "${s:-0}" -ge 5 ]
}
wait_until "ssp rank 1 to reach step 5" 300 rank1_at_5
kill -STOP "$S1"
b=$(step_of 1)
# Rank 0 runs into the bound (re-reading rank 1's step: a Step it had in flight when
# it was stopped may still land) ...
at_bound() {
    a=$(step_of 0)
    b=$(step_of 1)
    [ "$a" -ge $((b + K + 1)) ]
}
wait_until "ssp rank 0 to reach the bound (rank 1 stopped at step $b)" 300 at_bound
# ... and waits there: 2 s in which an unbounded rank 0 would run on.
sleep 2
a2=$(step_of 0)
b2=$(step_of 1)
kill -CONT "$S1"
[ "$b2" -le $((b + 1)) ] || fail "rank 1 moved while stopped ($b -> $b2)"
[ $((a2 - b2)) -eq $((K + 1)) ] ||
    fail "ssp:$K with rank 1 stopped at step $b2: rank 0 at step $a2 (want exactly $((b2 + K + 1)))"
wait "$S0" || fail "ssp rank 0: $(tail -3 "$TMP/s0.log")"
wait "$S1" || fail "ssp rank 1: $(tail -3 "$TMP/s1.log")"
lead=$("$STATS" "127.0.0.1:$P0" job/ssp/max_lead | awk '{print $2}')
[ "$lead" -le "$K" ] || fail "ssp:$K: a rank's Step returned $lead steps ahead"
ok "ssp:$K: rank 1 stopped at step $b2, rank 0 held at step $a2; max lead seen $lead; both finished"

# ---- async --------------------------------------------------------------------------
ASY=(--ps "$PSS" --job async --world 2 --sync async "${DATA[@]}" --lr 1 --max-steps 80
    --log-interval 20)
"$TRAINER" "${ASY[@]}" --rank 1 --metrics-out "$TMP/a1.jsonl" 2>"$TMP/a1.log" &
A1=$!
"$TRAINER" "${ASY[@]}" --rank 0 --metrics-out "$TMP/a0.jsonl" 2>"$TMP/a0.log" ||
    fail "async rank 0: $(tail -3 "$TMP/a0.log")"
wait "$A1" || fail "async rank 1: $(tail -3 "$TMP/a1.log")"
for r in 0 1; do
    first=$(losses "$TMP/a$r.jsonl" | head -1 | cut -d' ' -f2)
    last=$(losses "$TMP/a$r.jsonl" | tail -1 | cut -d' ' -f2)
    awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f - 1.0) }' ||
        fail "async rank $r: loss did not fall: $first -> $last"
done
ok "async: both ranks finished 80 steps, loss falling on each"

# ---- bad membership ---------------------------------------------------------------
expect_error "rank out of range" "rank 2 (from --rank) outside [0, 2)" \
    "$TRAINER" --ps "$PSS" --world 2 --rank 2 "${DATA[@]}"
expect_error "a rank that is not a number" "FERRY_RANK='x' is not a number" \
    env FERRY_RANK=x "$TRAINER" --ps "$PSS" --world 2 "${DATA[@]}"
expect_error "a job without servers" "needs --ps" "$TRAINER" --world 2 --rank 0 "${DATA[@]}"
expect_error "a new run of a finished job" "ferry-ps already holds 'bsp/" \
    "$TRAINER" --ps "$PSS" --job bsp --world 2 --rank 0 "${DATA[@]}"
# A job whose rank 0 stays up while the others misbehave.
"$TRAINER" --ps "$PSS" --job held --world 2 --rank 0 --sync-timeout 30 "${DATA[@]}" \
    --max-steps 3 2>"$TMP/h0.log" &
H0=$!
WAIT_LOG=$TMP/h0.log wait_until "rank 0 of 'held' to join" 300 grep -q "job 'held': rank 0 joined" "$TMP/ps0.log"
expect_error "another world" "job 'held' has world 2; this trainer says world 3" \
    "$TRAINER" --ps "$PSS" --job held --world 3 --rank 1 "${DATA[@]}"
expect_error "another model" "model differs from job 'held': H=100 here, H=200 in the job" \
    "$TRAINER" --ps "$PSS" --job held --world 2 --rank 1 --nhid 100 "${DATA[@]}"
expect_error "two trainers claiming one rank" "rank 0 of job 'held' is held by another live session" \
    "$TRAINER" --ps "$PSS" --job held --world 2 --rank 0 "${DATA[@]}"
"$TRAINER" --ps "$PSS" --job held --world 2 --rank 1 "${DATA[@]}" --max-steps 3 \
    2>"$TMP/h1.log" || fail "the right rank 1 could not join: $(tail -3 "$TMP/h1.log")"
wait "$H0" || fail "rank 0 of 'held': $(tail -3 "$TMP/h0.log")"
ok "the job went on: its own rank 1 joined after the refused ones and both finished"

# ---- a bsp rank that never comes -----------------------------------------------------
expect_error "a missing bsp rank" "rank 1 missing after" \
    "$TRAINER" --ps "$PSS" --job alone --world 2 --rank 0 --sync-timeout 2 "${DATA[@]}"

# The servers served all along and stop cleanly.
for p in $P0 $P1; do
    "$STATS" "127.0.0.1:$p" contexts_live >/dev/null || fail "ferry-ps :$p stopped answering"
done
stop_clean "$Q0" "ferry-ps 0" "$TMP/ps0.log"
stop_clean "$Q1" "ferry-ps 1" "$TMP/ps1.log"
ok "both ferry-ps served every job and exited 0 on SIGTERM"

# scripts/cluster.sh: the one-command job on this machine.
bash "$FERRY_SRC/scripts/cluster.sh" --servers 2 --trainers 2 --sync ssp:1 --job one \
    --bin "$FERRY_BIN" --dir "$TMP/cl" --no-view -- --data "$FERRY_SRC/data/ptb" \
    --train-tokens 30000 --eval-tokens 2000 --epochs 1 --max-steps 10 --log-interval 5 \
    >"$TMP/cl.out" 2>&1 || fail "cluster.sh: $(tail -5 "$TMP/cl.out")"
for f in ps0.log ps1.log rank0.log rank1.log rank0.jsonl rank1.jsonl; do
    [ -s "$TMP/cl/$f" ] || fail "cluster.sh wrote no $f"
done
grep -q "rank 1: .*done: 10 steps" "$TMP/cl.out" || fail "cluster.sh: $(cat "$TMP/cl.out")"
ok "scripts/cluster.sh ran 2 servers x 2 ranks to the end, a log per process"
finish
