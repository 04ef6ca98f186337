#!/usr/bin/env bash
# Replicated shards (--replicas 2), end to end: a bsp job of 2 shards x 2 replicas
# (four ferry-ps) and 2 ferry-trainer ranks, dropout on, a checkpoint every 5 steps.
#
# - Undisturbed, the job equals the same job on 2 unreplicated servers bit for bit
#   (every server file of the last step, both ranks' parts, the last loss), and the
#   two replicas of each shard hold the same state.
# - Each trial (FERRY_REPLICA_TRIALS, default 10) picks, from its seed, one of the four
#   servers and a step; the test SIGKILLs that server when rank 0 reaches the step
#   and starts it again later (its seed also picks how much later) on the same port
#   with the same command line. The job must finish with no roll-back (no recover
#   event, no "rolled back" in any log), log the failover, and end bit-identical to
#   the undisturbed run on the surviving replicas. The restarted server comes back at
#   the next checkpoint step (rank 0 copies the shard's checkpoint to it and every
#   rank takes its rank there through a recover barrier) and then ends identical too,
#   or, when the job ended first, is never called again.
# - A replica frozen (SIGSTOP) past the deadline, then let go (SIGCONT; FERRY_REPLICA_STALLS
#   runs, default 1): the shard
#   fails over within the deadline, and the frozen process, which missed the steps
#   since, is not called again until it is re-admitted at a checkpoint step, restored
#   from its sibling's checkpoint (it does not serve its stale state): every replica
#   ends identical.
# - A rank's crash in a replicated job rolls back on every replica alike.
# - Bad set-ups are refused in one line.
. "$(dirname "$0")/lib.sh"
TRIALS=${FERRY_REPLICA_TRIALS:-10}
STEPS=150
DATA=(--data "$FERRY_SRC/data/ptb" --train-tokens 8000 --eval-tokens 400 --epochs 1
    --emsize 32 --nhid 32 --bptt 10 --batch-size 4 --dropout 0.3 --seed 7
    --max-steps "$STEPS" --checkpoint-every 5 --log-interval 1 --progress off
    --deadline-ms 4000 --sync-timeout 30 --recovery-timeout 60)

# run_job DIR NSERVERS R [VICTIM AT DELAY]: NSERVERS ferry-ps (shards x R replicas,
# each shard's replicas side by side) and two ranks under DIR. VICTIM: a server index
# to SIGKILL when rank 0 has logged step AT, started again DELAY seconds later; or
# "stop:S" to freeze server S for 6 s (past the 4 s deadline: ample for the sanitizers'
# builds on a loaded machine, where calls of a healthy server take a second).
run_job() {
    local dir=$1 ns=$2 R=$3 victim=${4:-} at=${5:-0} delay=${6:-0}
    mkdir -p "$dir/save"
    local -a ports pspid rpid
    local name pss="" s
    for ((s = 0; s < ns; s++)); do
        mkdir -p "$dir/ck$s"
        name=$(basename "$dir")-ps$s
        start_ps "$name" --checkpoint-dir "$dir/ck$s" --checkpoint-keep 20 --context-ttl 30
        ports[$s]=$PORT
        pspid[$s]=$PS_PID
        pss=$pss${pss:+,}127.0.0.1:$PORT
    done
    start_rank() {
        "$TRAINER" --ps "$pss" --replicas "$R" ${REPLICATION:+--replication "$REPLICATION"} \
            --job rep --world 2 --rank "$1" "${DATA[@]}" \
            --save "$dir/save/lm" --metrics-out "$dir/m$1.jsonl" 2>>"$dir/r$1.log" &
        rpid[$1]=$!
    }
    start_rank 0
    start_rank 1
    if [ -n "$victim" ]; then
        wait_until "rank 0 to log step $at ($dir)" 300 logged "$dir/m0.jsonl" "\"step\":$at," "${rpid[0]}"
        case $victim in
        stop:*)
            s=${victim#stop:}
            kill -STOP "${pspid[$s]}"
            sleep 6
            kill -CONT "${pspid[$s]}"
            ;;
        r1) # a rank dies and comes back: the roll-back runs on every replica
            kill -9 "${rpid[1]}"
            reap_killed "${rpid[1]}" "$dir: rank 1"
            echo "=== restarted" >>"$dir/r1.log"
            start_rank 1
            ;;
        *)
            s=$victim
            kill -9 "${pspid[$s]}"
            reap_killed "${pspid[$s]}" "$dir: ferry-ps $s"
            sleep "$delay"
            name=$(basename "$dir")-ps$s
            echo "=== restarted" >>"$TMP/$name.log"
            rm -f "$TMP/$name.port"
            "$PS" --listen "127.0.0.1:${ports[$s]}" --port-file "$TMP/$name.port" \
                --checkpoint-dir "$dir/ck$s" --checkpoint-keep 20 --context-ttl 30 \
                2>>"$TMP/$name.log" &
            pspid[$s]=$!
            ;;
        esac
    fi
    local rc=0
    wait "${rpid[0]}" || rc=$?
    [ "$rc" = 0 ] || fail "$dir: rank 0 exited $rc: $(tail -5 "$dir/r0.log")"
    wait "${rpid[1]}" || rc=$?
    [ "$rc" = 0 ] || fail "$dir: rank 1 exited $rc: $(tail -5 "$dir/r1.log")"
    for ((s = 0; s < ns; s++)); do # a restarted server is up before ferry-ctl asks it
        name=$(basename "$dir")-ps$s PS_PID=${pspid[$s]}
        WAIT_LOG=$TMP/$name.log wait_until "ferry-ps $name up" 60 ps_port_written_
    done
    "$FERRY_BIN/server/ferry-ctl" --ps "$pss" --replicas "$R" job rep >"$dir/ctl.txt" 2>&1 ||
        fail "$dir: ferry-ctl job: $(cat "$dir/ctl.txt")"
    for ((s = 0; s < ns; s++)); do
        name=$(basename "$dir")-ps$s PS_PID=${pspid[$s]}
        WAIT_LOG=$TMP/$name.log wait_until "ferry-ps $name up" 60 ps_port_written_
        stop_clean "${pspid[$s]}" "$dir: ferry-ps $s" "$TMP/$(basename "$dir")-ps$s.log"
    done
}

last_loss() { train_losses "$1" | tail -1; }

# same_as_reference DIR SERVERS...: each listed server of DIR (index s, shard
# s / 2) ends in the reference's state for its shard; both ranks' parts and the
# last loss are the reference's.
same_as_reference() {
    local dir=$1 s
    shift
    for s in "$@"; do
        [ -s "$dir/ck$s/rep-step$STEPS.ckpt" ] || fail "$dir: server $s wrote no checkpoint of step $STEPS"
        same_state "$TMP/ref/ck$((s / 2))/rep-step$STEPS.ckpt" "$dir/ck$s/rep-step$STEPS.ckpt" \
            "$dir: server $s (shard $((s / 2))) against the unreplicated job"
    done
    for r in 0 1; do
        same_state "$TMP/ref/save/lm.r$r.$STEPS" "$dir/save/lm.r$r.$STEPS" "$dir: rank $r's part"
    done
    [ "$(last_loss "$dir/m0.jsonl")" = "$(last_loss "$TMP/ref/m0.jsonl")" ] ||
        fail "$dir: last loss $(last_loss "$dir/m0.jsonl"), undisturbed $(last_loss "$TMP/ref/m0.jsonl")"
}

no_rollback() {
    local dir=$1
    ! grep -l '"event":"recover"' "$dir"/m*.jsonl 2>/dev/null | grep -q . ||
        fail "$dir: a recover event: $(grep -h '"event":"recover"' "$dir"/m*.jsonl | head -1); why: $(grep -h ' W ' "$dir"/r*.log | head -4)"
    ! grep -q 'rolled back' "$dir"/r*.log || fail "$dir: $(grep -h 'rolled back' "$dir"/r*.log | head -1)"
}

# ---- bad set-ups ----
BAD=(--data "$FERRY_SRC/data/ptb" --train-tokens 4000 --eval-tokens 400 --epochs 1 --emsize 8
    --nhid 8 --bptt 5 --batch-size 4 --max-steps 2 --progress off)
start_ps bad0
P0=$PORT B0=$PS_PID
start_ps bad1
P1=$PORT B1=$PS_PID
start_ps bad2
P2=$PORT B2=$PS_PID
expect_error "three servers for two replicas per shard" "a multiple of 2 servers" \
    "$TRAINER" --ps "127.0.0.1:$P0,127.0.0.1:$P1,127.0.0.1:$P2" --replicas 2 "${BAD[@]}"
expect_error "one server listed twice" "listed twice" \
    "$TRAINER" --ps "127.0.0.1:$P0,127.0.0.1:$P0" --replicas 2 "${BAD[@]}"
expect_error "--replicas without --ps" "--replicas 2 needs --ps" \
    "$TRAINER" --replicas 2 "${BAD[@]}"
expect_error "--replicas with --sync async" "needs --sync bsp" \
    "$TRAINER" --ps "127.0.0.1:$P0,127.0.0.1:$P1" --replicas 2 --sync async --world 2 --rank 0 \
    "${BAD[@]}"
for p in "$B0" "$B1" "$B2"; do stop_clean "$p" "ferry-ps (bad set-ups)"; done

# ---- undisturbed: the unreplicated job, and the replicated one ----
run_job "$TMP/ref" 2 1
run_job "$TMP/undisturbed" 4 2
same_as_reference "$TMP/undisturbed" 0 1 2 3
no_rollback "$TMP/undisturbed"
grep -q "^shard 1:" "$TMP/undisturbed/ctl.txt" &&
    [ "$(grep -c "at step $STEPS .*primary" "$TMP/undisturbed/ctl.txt")" = 2 ] ||
    fail "ferry-ctl job: $(cat "$TMP/undisturbed/ctl.txt")"
ok "2 shards x 2 replicas: bit-identical to 2 unreplicated servers, replicas identical (loss $(last_loss "$TMP/ref/m0.jsonl")); ferry-ctl job shows a primary per shard"
REPLICATION=active run_job "$TMP/active" 4 2
same_as_reference "$TMP/active" 0 1 2 3
grep -q "2 replicas, active" "$TMP/active/r0.log" || fail "active: $(grep distributed "$TMP/active/r0.log")"
ok "--replication active (every replica computes every call): bit-identical too"

# ---- SIGKILL trials ----
readmitted=0
for ((t = 1; t <= TRIALS; t++)); do
    RANDOM=$((1000 + t))
    victim=$((RANDOM % 4)) at=$((3 + RANDOM % 33)) delay=$((RANDOM % 3))
    dir=$TMP/kill$t
    run_job "$dir" 4 2 "$victim" "$at" "0.$((delay * 2))"
    no_rollback "$dir"
    grep -q "replica 127.0.0.1:[0-9]* of shard $((victim / 2)) dropped" "$dir/r0.log" ||
        fail "$dir: rank 0 logged no drop of server $victim: $(grep -h ' W ' "$dir/r0.log" | head -3)"
    grep -q '"event":"failover"' "$dir/m0.jsonl" || fail "$dir: no failover event in rank 0's metrics"
    sibling=$((victim ^ 1))
    others=$(((victim / 2) ^ 1))
    same_as_reference "$dir" "$sibling" $((others * 2)) $((others * 2 + 1))
    # Back in the job at a checkpoint after its restart, or (the job ended first) out.
    if back=$(grep -o 're-admitted after step [0-9]*' "$dir/r0.log"); then
        grep -q 're-admitted' "$dir/r1.log" || fail "$dir: rank 0 re-admitted server $victim, rank 1 did not"
        same_as_reference "$dir" "$victim"
        [ "$(grep -c "at step $STEPS .*primary\|at step $STEPS .*in step" "$dir/ctl.txt")" = 4 ] ||
            fail "$dir: ferry-ctl job does not show all four replicas in step: $(cat "$dir/ctl.txt")"
        readmitted=$((readmitted + 1))
        how="re-admitted ${back#re-admitted }, identical there too"
    else
        [ ! -e "$dir/ck$victim/rep-step$STEPS.ckpt" ] ||
            fail "$dir: server $victim, never re-admitted, wrote a checkpoint of step $STEPS"
        grep -q "127.0.0.1:[0-9]* .*behind\|127.0.0.1:[0-9]* .*does not hold" "$dir/ctl.txt" ||
            fail "$dir: ferry-ctl job does not show the restarted server behind: $(cat "$dir/ctl.txt")"
        how="not re-admitted before the end"
    fi
    when=$(grep -o "dropped: its [A-Za-z]* failed" "$dir/r0.log" | head -1 | cut -d' ' -f3)
    ok "trial $t: server $victim (shard $((victim / 2))) SIGKILLed at step $at, restarted 0.$((delay * 2)) s later: rank 0 dropped it at its $when, no roll-back, identical; $how"
    rm -rf "$dir"
done
[ "$TRIALS" = 0 ] || [ "$readmitted" -gt 0 ] || fail "no trial re-admitted its restarted server"

# ---- a frozen replica (FERRY_REPLICA_STALLS runs, default 1) ----
for ((t = 1; t <= ${FERRY_REPLICA_STALLS:-1}; t++)); do
    dir=$TMP/stop
    t0=$SECONDS
    run_job "$dir" 4 2 stop:2 10
    no_rollback "$dir"
    same_as_reference "$dir" 3 0 1
    grep -Eq "replica 127.0.0.1:[0-9]* of shard 1 dropped: its .*(DEADLINE_EXCEEDED|no answer 4000 ms)" "$dir/r0.log" ||
        fail "$dir: no drop of the frozen server after its deadline: $(grep -h ' W ' "$dir/r0.log" | head -3)"
    # Rank 0 probes it before each checkpoint step (1 s at most while it is frozen); the
    # first checkpoint after it answers again takes it back, on both ranks alike.
    back=$(grep -o 're-admitted after step [0-9]*' "$dir/r0.log") ||
        fail "$dir: the server let go was not re-admitted: $(grep -h 'stays out\|offering' "$dir/r0.log" | head -3)"
    grep -q "$back" "$dir/r1.log" || fail "$dir: rank 0 $back, rank 1 did not"
    grep -q '"event":"readmit".*"readmitted":1' "$dir/m0.jsonl" || fail "$dir: no readmit event"
    same_as_reference "$dir" 2
    ok "a replica frozen 6 s (deadline 4 s) at step 10: dropped, ${back#re-admitted } re-admitted from its sibling's checkpoint, identical to the end ($((SECONDS - t0)) s)"
    rm -rf "$dir"
done

# ---- a rank's crash in a replicated job: the roll-back restores every replica ----
dir=$TMP/rank
run_job "$dir" 4 2 r1 20
grep -q 'rolled back to step' "$dir/r1.log" || fail "$dir: rank 1 did not roll back: $(tail -3 "$dir/r1.log")"
same_as_reference "$dir" 0 1 2 3
ok "rank 1 SIGKILLed at step 20 and restarted: rolled back on all four replicas, identical"

finish
