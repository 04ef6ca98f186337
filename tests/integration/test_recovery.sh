#!/usr/bin/env bash
# Crash recovery, end to end: a bsp job of 2 ferry-ps x 2 ferry-trainer with dropout
# on and a checkpoint every 5 steps. Each trial (FERRY_RECOVERY_TRIALS, default 10)
# picks, from its seed, one process (a server or a rank) and a step; the test's
# supervisor kills it with SIGKILL when rank 0 reaches that step and starts it again
# with the same command line. The job must finish by itself, roll back to the newest
# checkpoint complete when it failed (check_rollback), and its final state (every
# server's checkpoint of the last step: parameters, optimizer state and versions;
# both ranks' parts: LSTM, carried state, position) and the loss of its last step
# must be bit-identical to an undisturbed run with the same seed. Every process must
# exit as it should (0, or 137 where the test killed it) and no log may hold a
# sanitizer report. Then: a
# server frozen (SIGSTOP) for less than the recovery timeout, and for more than the
# deadline (its calls are sent again and applied once), leaves the run identical too;
# one past --recovery-timeout ends the job with a clear error. Shards found fresh,
# older or newer than the ranks are reported and dealt with.
. "$(dirname "$0")/lib.sh"
TRIALS=${FERRY_RECOVERY_TRIALS:-10}
STEPS=40
DATA=(--data "$FERRY_SRC/data/ptb" --train-tokens 4000 --eval-tokens 400 --epochs 1
    --emsize 32 --nhid 32 --bptt 10 --batch-size 4 --dropout 0.3 --seed 7
    --max-steps "$STEPS" --checkpoint-every 5 --log-interval 1 --progress off
    --deadline-ms 2000 --sync-timeout 30 --recovery-timeout 60)

# logged_step_ FILE STEP PID: the state run_job waits for: the rank whose metrics
# FILE is has logged STEP; the test fails if that rank (PID) exited first.
logged_step_() {
    grep -q "\"event\":\"train\".*\"step\":$2," "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || fail "rank 0 exited before step $2: $(tail -3 "${1%/*}/r0.log")"
    return 1
}

# check_rollback DIR WHAT: the job under DIR rolled back to the newest checkpoint
# (every 5 steps) that was complete when it failed. Rank 0 logged step LF last before
# its recover event (each line is flushed as it is written), so every process had
# finished step LF - 1 (bsp), with the checkpoints up to it; none had finished step
# LF + 2. The roll-back step R must be a checkpoint step with
# 5*floor((LF-1)/5) <= R <= LF + 1: a roll-back to an older checkpoint (or to step 0)
# fails. Sets LF and ROLLED. (The step rank 0 had logged when the test sent the kill
# says less: these steps take milliseconds, and the job moves on while the kill is
# on its way.)
check_rollback() {
    local dir=$1 what=$2 lf r lo
    lf=$(awk '/"event":"recover"/ { exit } /"event":"train"/ {
        sub(/.*"step":/, ""); sub(/,.*/, ""); s = $0 } END { print s + 0 }' "$dir/m0.jsonl")
    r=$(grep -o 'recovered in .* rolled back to step [0-9]*' "$dir/r0.log" | head -1 | grep -o '[0-9]*$') ||
        fail "$what: rank 0 logged no roll-back: $(tail -3 "$dir/r0.log")"
    lo=$(((lf - 1) / 5 * 5))
    [ $((r % 5)) -eq 0 ] && [ "$r" -ge "$lo" ] && [ "$r" -le $((lf + 1)) ] ||
        fail "$what: rolled back to step $r; rank 0 had logged step $lf, so the newest complete checkpoint was step $lo or later (and at most $((lf + 1)))"
    LF=$lf ROLLED=$r
}

# run_job DIR [VICTIM AT [DELAY]]: servers and ranks under DIR. With a victim (ps0,
# ps1, r0, r1, or two of them as "ps1+r0"), each is killed with SIGKILL once AT is
# reached, then started again with its command line (after DELAY seconds, default 0).
# AT: a step rank 0 has logged; "end" (both ranks wrote their parts of the last step:
# they evaluate, leave and exit); "write" (the victim, ps0 or r1, has a checkpoint
# write after step 0's under way: its temporary file exists). Sets KILLED_IN_WRITE to 1 when the kill
# left a temporary file behind, KILL_MISSED to 1 when a rank victim had already exited.
run_job() {
    local dir=$1 victim=${2:-} at=${3:-0} delay=${4:-0}
    mkdir -p "$dir/ck0" "$dir/ck1" "$dir/save"
    local -a ports pspid rpid
    for s in 0 1; do
        start_ps "$(basename "$dir")-ps$s" --checkpoint-dir "$dir/ck$s" --checkpoint-keep 20 \
            --context-ttl 30
        ports[$s]=$PORT
        pspid[$s]=$PS_PID
    done
    local pss="127.0.0.1:${ports[0]},127.0.0.1:${ports[1]}"
    start_rank() {
        "$TRAINER" --ps "$pss" --job rec --world 2 --rank "$1" "${DATA[@]}" \
            --save "$dir/save/lm" --metrics-out "$dir/m$1.jsonl" 2>>"$dir/r$1.log" &
        rpid[$1]=$!
    }
    start_rank 0
    start_rank 1
    KILLED_IN_WRITE=0 KILL_MISSED=0
    if [ -n "$victim" ]; then
        # (not step 0's, written while the ranks start: nothing to roll back to yet)
        local tmpglob=$dir/ck0/.rec-step[1-9]*.ckpt.?????? v
        [ "${victim%%+*}" = r1 ] && tmpglob=$dir/save/.lm.r1.[1-9]*.??????
        for _ in $(seq 600); do
            case $at in
            end) [ -s "$dir/save/lm.r0.$STEPS" ] && [ -s "$dir/save/lm.r1.$STEPS" ] && break ;;
            write) # a busy wait: a write lasts milliseconds; a builtin glob per turn
                for _ in $(seq 20000); do compgen -G "$tmpglob" >/dev/null && break 2; done ;;
            *) wait_until "rank 0 to log step $at ($dir)" 300 logged_step_ "$dir/m0.jsonl" "$at" "${rpid[0]}"
                break ;;
            esac
            kill -0 "${rpid[0]}" 2>/dev/null || break
            sleep 0.02
        done
        case $victim in
        usr1) # ask rank 1 for a job-wide checkpoint; training goes on
            kill -USR1 "${rpid[1]}"
            ;;
        stop:*) # freeze server 1 for that many seconds, then let it go on; with
            # stop:S:N, up to N times, 0.1 s apart, until a rank logs a call sent again
            local spec=${victim#stop:} n
            n=${spec#*:}
            [ "$n" = "$spec" ] && n=1
            for _ in $(seq "$n"); do
                kill -STOP "${pspid[1]}"
                sleep "${spec%%:*}"
                kill -CONT "${pspid[1]}"
                sleep 0.1
                grep -q "answered after" "$dir"/r*.log && break
                kill -0 "${rpid[0]}" 2>/dev/null || break
            done
            ;;
        *) # SIGKILL each victim at once, then start each again
            for v in ${victim//+/ }; do
                case $v in
                ps*) kill -9 "${pspid[${v#ps}]}" ;;
                r*) kill -9 "${rpid[${v#r}]}" 2>/dev/null || KILL_MISSED=1 ;; # it had exited
                esac
            done
            [ "$at" = write ] && compgen -G "$tmpglob" >/dev/null && KILLED_IN_WRITE=1
            sleep "$delay"
            for v in ${victim//+/ }; do
                case $v in
                ps*)
                    local s=${v#ps}
                    reap_killed "${pspid[$s]}" "$dir: ferry-ps $s"
                    echo "=== restarted" >>"$TMP/$(basename "$dir")-ps$s.log"
                    "$PS" --listen "127.0.0.1:${ports[$s]}" --checkpoint-dir "$dir/ck$s" \
                        --checkpoint-keep 20 --context-ttl 30 2>>"$TMP/$(basename "$dir")-ps$s.log" &
                    pspid[$s]=$!
                    ;;
                r*)
                    local r=${v#r}
                    [ "$KILL_MISSED" = 1 ] && { wait "${rpid[$r]}" || true; } ||
                        reap_killed "${rpid[$r]}" "$dir: rank $r"
                    echo "=== restarted" >>"$dir/r$r.log"
                    start_rank "$r"
                    ;;
                esac
            done
            ;;
        esac
    fi
    local rc=0
    wait "${rpid[0]}" || rc=$?
    [ "$rc" = 0 ] || fail "$dir: rank 0 exited $rc: $(tail -5 "$dir/r0.log")"
    wait "${rpid[1]}" || rc=$?
    [ "$rc" = 0 ] || fail "$dir: rank 1 exited $rc: $(tail -5 "$dir/r1.log")"
    for s in 0 1; do
        stop_clean "${pspid[$s]}" "$dir: ferry-ps $s" "$TMP/$(basename "$dir")-ps$s.log"
    done
}

# The last step's files and loss must equal the reference's (REF, default the
# undisturbed run $TMP/ref), byte for byte.
same_as_ref() {
    local dir=$1 what=$2 ref=${REF:-$TMP/ref}
    for s in 0 1; do
        cmp -s "$ref/ck$s/rec-step$STEPS.ckpt" "$dir/ck$s/rec-step$STEPS.ckpt" ||
            fail "$what: server $s's state at step $STEPS differs from the undisturbed run"
    done
    for r in 0 1; do
        cmp -s "$ref/save/lm.r$r.$STEPS" "$dir/save/lm.r$r.$STEPS" ||
            fail "$what: rank $r's part at step $STEPS differs from the undisturbed run"
    done
    local a b
    a=$(train_losses "$ref/m0.jsonl" | tail -1)
    b=$(train_losses "$dir/m0.jsonl" | tail -1)
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "$what: last loss $b, undisturbed $a"
    # Each rank's final evaluations (valid, then test: split, epoch, step, loss) as in
    # the undisturbed run, whatever was evaluated twice.
    for r in 0 1; do
        a=$(evals "$ref/m$r.jsonl")
        b=$(evals "$dir/m$r.jsonl")
        [ -n "$a" ] && [ "$a" = "$b" ] || fail "$what: rank $r evaluated
 $b
 undisturbed:
 $a"
    done
    # No temporary file of an interrupted checkpoint write is left.
    b=$(find "$dir" -name '.*.??????' | head -3)
    [ -z "$b" ] || fail "$what: temporary files left: $b"
}

# A rank's last valid and last test evaluation events.
evals() {
    for split in valid test; do grep "\"event\":\"eval\",\"split\":\"$split\"" "$1" | tail -1; done
}

run_job "$TMP/ref"
[ -s "$TMP/ref/ck0/rec-step$STEPS.ckpt" ] || fail "no server checkpoint at step $STEPS"
ok "undisturbed run: 2 ferry-ps x 2 ranks, dropout 0.3, $STEPS steps, checkpoints every 5"

# kill_trial DIR VICTIM AT: one trial, checked against REF (default the undisturbed run).
kill_trial() {
    local dir=$1 victim=$2 at=$3
    run_job "$dir" "$victim" "$at"
    grep -q "recovered in" "$dir/r0.log" ||
        fail "$dir ($victim at step $at): rank 0 never recovered: $(tail -5 "$dir/r0.log")"
    grep -q '"event":"recover"' "$dir/m0.jsonl" || fail "$dir: no recover event"
    check_rollback "$dir" "$dir ($victim killed at step $at)"
    same_as_ref "$dir" "$dir ($victim killed at step $at)"
    echo "  ${dir##*/}: $victim SIGKILLed at step $at (rank 0's last step before the failure: $LF) -> rolled back to step $ROLLED, identical"
    no_sanitizer_reports "$dir"
    rm -rf "$dir"
}

identical=0
victims=(ps0 ps1 r0 r1)
for trial in $(seq 1 "$TRIALS"); do
    RANDOM=$((trial * 7919))
    victim=${victims[$(((trial - 1) % 4))]} # every kind in turn; the step from the seed
    kill_trial "$TMP/t$trial" "$victim" $((2 + RANDOM % (STEPS - 4)))
    identical=$((identical + 1))
done
ok "$identical of $TRIALS trials (a server or a rank SIGKILLed at a random step, restarted): the job rolled back to its newest complete checkpoint, finished by itself, bit-identical"

# The same with a decoder slice in each trainer (--local-vocab): its block is a module
# of its own, pulled and pushed on a thread beside the LSTM's work (worker/model.c), so
# a failure can strike while that transfer is out. FERRY_RECOVERY_LV_TRIALS (default
# 4: one per kind of victim) trials.
LV_TRIALS=${FERRY_RECOVERY_LV_TRIALS:-4}
DATA_NOLV=("${DATA[@]}")
DATA+=(--local-vocab 3000)
run_job "$TMP/ref-lv"
for k in $(seq 1 "$LV_TRIALS"); do
    RANDOM=$((k * 104729))
    REF=$TMP/ref-lv kill_trial "$TMP/lv$k" "${victims[$(((k - 1) % 4))]}" $((2 + RANDOM % (STEPS - 4)))
done
rm -rf "$TMP/ref-lv"
DATA=("${DATA_NOLV[@]}")
ok "--local-vocab 3000: a server or a rank SIGKILLed while the slice's transfer may be out ($LV_TRIALS trials): rolled back, finished, bit-identical to its undisturbed run"

# ---- at the edges ------------------------------------------------------------------
# After restarts: the lines of a log written since the last "=== restarted".
since_restart() { sed -n '/=== restarted/,$p' "$1"; }

# A rank killed after its last step (its part of step 40 written; it evaluates, leaves
# and exits, the other rank too) finds its part and finishes: no roll-back nobody can
# join, its evaluations as in the undisturbed run.
for attempt in 1 2 3; do
    rm -rf "$TMP/end-r1"
    run_job "$TMP/end-r1" r1 end
    [ "$KILL_MISSED" = 0 ] && break
    echo "  rank 1 killed at the end, run $attempt: it had exited already; again"
done
[ "$KILL_MISSED" = 0 ] || fail "rank 1 killed after the last step: it had exited in 3 runs"
same_as_ref "$TMP/end-r1" "rank 1 killed after the last step"
since_restart "$TMP/end-r1/r1.log" | grep -q "without a roll-back\|rolled back to step $STEPS\|nothing is left" ||
    fail "rank 1 restarted after the last step: $(since_restart "$TMP/end-r1/r1.log" | grep -v ' I ' | tail -3)"
ok "rank 1 SIGKILLed after its last step, restarted: $(since_restart "$TMP/end-r1/r1.log" | grep -o 'recovered in [0-9.]* s[^:]*\|job .* is complete' | head -1), evaluated as undisturbed, bit-identical"

# The same rank started once more, as a supervisor would, over restarted servers:
# it says the job is done (or evaluates again) and exits 0; it never loops. It also
# removes, at start, the temporary files of writes a kill interrupted (its own: the
# name of its part, the magic or a prefix of it), and so does a restarted ferry-ps;
# nothing else.
d=$TMP/end-r1
head -c 1000 "$d/ck0/rec-step20.ckpt" >"$d/ck0/.rec-step25.ckpt.Ab12Cd" # cut mid-write
: >"$d/ck0/.rec-step30.ckpt.Ef34Gh"                                       # before a flush
echo "keep me" >"$d/ck0/.notes.txt.Ij56Kl"                                # not a checkpoint
head -c 1000 "$d/ck0/rec-step20.ckpt" >"$d/ck0/.rec-step35.ckpt.Mn78"     # not mkostemp's
ln -s "$d/ck0/rec-step20.ckpt" "$d/ck0/.rec-step15.ckpt.Op90Qr"           # a symlink
head -c 500 "$d/save/lm.r1.$STEPS" >"$d/save/.lm.r1.25.St12Uv"           # rank 1's
head -c 500 "$d/save/lm.r0.$STEPS" >"$d/save/.lm.r0.25.Wx34Yz"           # rank 0's
head -c 500 "$d/ck0/rec-step20.ckpt" >"$d/save/.lm.r1.30.Ab56Cd"          # other magic
start_ps again0 --checkpoint-dir "$d/ck0" --checkpoint-keep 20
p0=$PORT q0=$PS_PID
start_ps again1 --checkpoint-dir "$d/ck1" --checkpoint-keep 20
p1=$PORT q1=$PS_PID
echo "=== restarted" >>"$d/r1.log"
"$TRAINER" --ps "127.0.0.1:$p0,127.0.0.1:$p1" --job rec --world 2 --rank 1 "${DATA[@]}" \
    --save "$d/save/lm" --metrics-out "$d/m1.jsonl" 2>>"$d/r1.log" ||
    fail "rank 1 started again after the end: $(tail -3 "$d/r1.log")"
kill "$q0" "$q1"
wait "$q0" "$q1" 2>/dev/null || true
for f in ck0/.rec-step25.ckpt.Ab12Cd ck0/.rec-step30.ckpt.Ef34Gh save/.lm.r1.25.St12Uv; do
    [ -e "$d/$f" ] && fail "the temporary file $f of an interrupted write is still there"
done
for f in ck0/.notes.txt.Ij56Kl ck0/.rec-step35.ckpt.Mn78 ck0/.rec-step15.ckpt.Op90Qr \
    save/.lm.r0.25.Wx34Yz save/.lm.r1.30.Ab56Cd; do
    [ -e "$d/$f" ] || [ -L "$d/$f" ] || fail "$f, not a temporary file of this process's writes, was removed"
    rm -f "$d/$f"
done
same_as_ref "$d" "rank 1 started again after the end"
ok "rank 1 started again after the job's end: exit 0 ($(since_restart "$d/r1.log" | grep -o 'without a roll-back\|nothing is left for it to do' | head -1)); interrupted writes' temporary files removed by ferry-ps and the rank, other files kept"
rm -rf "$d"

# A server killed while the ranks evaluate after the last step: the job rolls back to
# (or stands at) step 40, and both ranks evaluate as an undisturbed run does, with the
# right epoch. The evaluation of the other runs takes tens of milliseconds, less than a
# loaded machine may take to see the last step's files and send the kill (CI missed it
# three runs in a row): these runs evaluate 20 times as many tokens, against an
# undisturbed run that does too. Up to 3 runs; one must land the kill in it.
DATA0=("${DATA[@]}")
for i in "${!DATA[@]}"; do
    [ "${DATA[$i]}" = --eval-tokens ] && DATA[i + 1]=$((DATA[i + 1] * 20))
done
[ "${DATA[*]}" != "${DATA0[*]}" ] || fail "no --eval-tokens in DATA to lengthen"
run_job "$TMP/ref-end"
for attempt in 1 2 3; do
    rm -rf "$TMP/end-ps1"
    run_job "$TMP/end-ps1" ps1 end
    grep -q "recovered in" "$TMP/end-ps1"/r*.log && break
    echo "  server 1 killed at the end, run $attempt: the ranks had finished already; again"
done
DATA=("${DATA0[@]}")
grep -q "recovered in" "$TMP/end-ps1"/r*.log ||
    fail "server 1 killed after the last step: no rank recovered in 3 runs"
REF=$TMP/ref-end same_as_ref "$TMP/end-ps1" "server 1 killed during the final evaluation"
ok "server 1 SIGKILLed during the final evaluation, restarted: $(cat "$TMP/end-ps1"/r*.log | grep -o 'recovered in [0-9.]* s[^:;]*' | head -1); both ranks evaluated as undisturbed, bit-identical"
rm -rf "$TMP/end-ps1" "$TMP/ref-end"

# Two processes at once, at a random step: a server and a rank, then both ranks.
for pair in ps1+r0 r0+r1; do
    at=$((2 + RANDOM % (STEPS - 4)))
    run_job "$TMP/pair" "$pair" "$at"
    same_as_ref "$TMP/pair" "$pair SIGKILLed at step $at"
    ok "$pair SIGKILLed together at step $at, restarted: $(grep -o 'rolled back to step [0-9]*' "$TMP/pair/r0.log" | tail -1), bit-identical"
    rm -rf "$TMP/pair"
done

# A kill timed into a checkpoint write (its temporary file exists): ferry-ps 0 writing
# a job checkpoint, rank 1 writing its part. The restarted process removes what the
# write left; the job finishes identical.
for v in ps0 r1; do
    run_job "$TMP/write" "$v" write
    same_as_ref "$TMP/write" "$v SIGKILLed while writing a checkpoint"
    if [ "$KILLED_IN_WRITE" = 1 ]; then
        landed="the kill left its temporary file, removed at the restart"
    else
        landed="the write had ended before the kill"
    fi
    ok "$v SIGKILLed during a checkpoint write ($landed): no temporary file left, bit-identical"
    rm -rf "$TMP/write"
done

# A restart later than the deadline (2 s) but within the recovery timeout, timed into
# rank 0's checkpoint of step 10: both ranks wait, roll back and finish identical, and
# the recovery time each logs is the real one (at least the 4 s the server was away).
run_job "$TMP/late" ps0 10 4
same_as_ref "$TMP/late" "server 0 restarted 4 s after its kill"
for r in 0 1; do
    secs=$(grep -o '"event":"recover".*"seconds":[0-9.e+-]*' "$TMP/late/m$r.jsonl" | tail -1 |
        sed 's/.*"seconds"://')
    [ -n "$secs" ] || fail "late restart: rank $r logged no recovery"
    awk -v s="$secs" 'BEGIN { exit !(s >= 3.5) }' ||
        fail "late restart: rank $r says it recovered in $secs s; the server was away 4 s"
done
ok "server 0 SIGKILLed at step 10 and restarted 4 s later: both ranks recovered ($(grep -o 'recovered in [0-9.]* s' "$TMP/late/r0.log" | tail -1), $(grep -o 'recovered in [0-9.]* s' "$TMP/late/r1.log" | tail -1)), bit-identical"
rm -rf "$TMP/late"

# A rank that leaves while the other waits for it: the waiting rank stops at once
# (its --sync-timeout is 10 minutes) with one line naming the rank and why it left.
# First rank 0 stopped by SIGTERM (it checkpoints and leaves), then rank 1 of a job
# without recovery killed outright (its Session stream closes: its trainer went away).
leave_case() { # NAME SIGNAL VICTIM WAITER PHRASE [DATA...]
    local name=$1 sig=$2 victim=$3 waiter=$4 phrase=$5 d=$TMP/$1
    shift 5
    mkdir -p "$d/ck0" "$d/ck1" "$d/save"
    start_ps "$name-ps0" --checkpoint-dir "$d/ck0"
    local p0=$PORT q0=$PS_PID
    start_ps "$name-ps1" --checkpoint-dir "$d/ck1"
    local p1=$PORT q1=$PS_PID pid=()
    for r in 0 1; do
        "$TRAINER" --ps "127.0.0.1:$p0,127.0.0.1:$p1" --job rec --world 2 --rank "$r" "$@" \
            --sync-timeout 600 --save "$d/save/lm" --metrics-out "$d/m$r.jsonl" 2>"$d/r$r.log" &
        pid[$r]=$!
    done
    for _ in $(seq 600); do
        grep -q '"event":"train".*"step":12,' "$d/m0.jsonl" 2>/dev/null && break
        sleep 0.02
    done
    kill "-$sig" "${pid[$victim]}"
    local rc=0
    wait "${pid[$waiter]}" || rc=$?
    wait "${pid[$victim]}" 2>/dev/null || true
    kill "$q0" "$q1"
    wait "$q0" "$q1" 2>/dev/null || true
    [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] || fail "$name: rank $waiter exited $rc"
    grep -v '^[0-9T:.-]*Z [IW] ' "$d/r$waiter.log" >"$d/err" || true
    [ "$(grep -c . "$d/err")" -eq 1 ] || fail "$name: rank $waiter said more than one line: $(cat "$d/err")"
    grep -q "$phrase" "$d/err" || fail "$name: rank $waiter's error does not say '$phrase': $(cat "$d/err")"
    grep -q "missing after\|sync-timeout" "$d/err" && fail "$name: rank $waiter waited for the timeout: $(cat "$d/err")"
    ok "$name: rank $waiter stopped at once: $(cat "$d/err")"
    rm -rf "$d"
}
leave_case leave TERM 0 1 "rank 0 left the job after step 1[0-9]* (stopped by a signal" "${DATA[@]}"
NOREC=()
for ((i = 0; i < ${#DATA[@]}; i++)); do
    case ${DATA[$i]} in
    --checkpoint-every | --recovery-timeout) i=$((i + 1)) ;;
    *) NOREC+=("${DATA[$i]}") ;;
    esac
done
leave_case gone KILL 1 0 "rank 1's trainer went away (its connection closed)" "${NOREC[@]}"

# ---- a checkpoint on request: SIGUSR1 to rank 1 -----------------------------------------
run_job "$TMP/usr1" usr1 12
n0=$(grep -o "checkpoint at step [0-9]* (requested)" "$TMP/usr1/r0.log" | grep -o "[0-9]*" | head -1)
n1=$(grep -o "checkpoint at step [0-9]* (requested)" "$TMP/usr1/r1.log" | grep -o "[0-9]*" | head -1)
[ -n "$n0" ] && [ "$n0" = "$n1" ] || fail "SIGUSR1 to rank 1: ranks checkpointed after steps '$n0' and '$n1'"
for s in 0 1; do
    [ -s "$TMP/usr1/ck$s/rec-step$n0.ckpt" ] || fail "SIGUSR1: server $s wrote no rec-step$n0.ckpt"
done
same_as_ref "$TMP/usr1" "checkpoint on request"
ok "SIGUSR1 to rank 1: both ranks and both servers checkpointed after step $n0, training went on, bit-identical"

# ---- stalls: SIGSTOP shorter than the deadline, and longer ----------------------------
run_job "$TMP/stall1" stop:1 12
grep -q "recover" "$TMP/stall1/r0.log" && fail "a 1 s stall (deadline 2 s) made the job recover"
same_as_ref "$TMP/stall1" "1 s stall"
ok "server 1 frozen 1 s (under the 2 s deadline): no recovery, bit-identical"
# The freezes land after rank 0 logged step 12. A call sent to the frozen server times
# out (2 s) and goes again until it is answered, the job status query each rank makes
# as it logs a step among them. A freeze that falls while both ranks wait in a bsp
# GradNorm (whose deadline includes --sync-timeout) has no call due to time out, so
# server 1 is frozen again (up to 4 times per run, 2 runs) until a rank logs a call
# sent again; every run must end without a roll-back.
for attempt in 1 2; do
    [ ! -d "$TMP/stall2" ] || no_sanitizer_reports "$TMP/stall2"
    [ ! -d "$TMP/stall2" ] || ! grep -q "recover" "$TMP/stall2"/r*.log ||
        fail "a 5 s stall (under the recovery timeout) made the job roll back: $(grep -h recover "$TMP/stall2"/r*.log | head -2)"
    rm -rf "$TMP/stall2"
    run_job "$TMP/stall2" stop:5:4 12
    grep -q "answered after" "$TMP/stall2"/r*.log && break
    echo "  5 s stall, run $attempt: every freeze fell in a GradNorm wait; again"
done
grep -q "answered after" "$TMP/stall2"/r*.log ||
    fail "a 5 s stall: no call was sent again in 2 runs (4 freezes each): $(tail -3 "$TMP/stall2/r0.log")"
grep -q "recover" "$TMP/stall2/r0.log" "$TMP/stall2/r1.log" &&
    fail "a 5 s stall (under the recovery timeout) made the job roll back: $(grep recover "$TMP/stall2/r0.log" | head -2)"
same_as_ref "$TMP/stall2" "5 s stall"
ok "server 1 frozen 5 s (past the 2 s deadline): the calls were sent again and applied once, no roll-back, bit-identical"

# A stall longer than --recovery-timeout: the ranks give up with a clear error and a
# non-zero exit (a hang would meet ctest's timeout); the frozen server is then let go
# and stopped. How long they took is reported, not checked: a bsp GradNorm may wait
# --sync-timeout (5) for the other ranks, then the deadline (2), then retries and
# roll-back share --recovery-timeout (4), plus a deadline for the last probe: 13 s
# on an idle machine.
d=$TMP/stall3
mkdir -p "$d/ck0" "$d/ck1" "$d/save"
start_ps stall3-ps0 --checkpoint-dir "$d/ck0"
p0=$PORT q0=$PS_PID
start_ps stall3-ps1 --checkpoint-dir "$d/ck1"
p1=$PORT q1=$PS_PID
for r in 0 1; do
    "$TRAINER" --ps "127.0.0.1:$p0,127.0.0.1:$p1" --job rec --world 2 --rank "$r" "${DATA[@]}" \
        --recovery-timeout 4 --sync-timeout 5 --save "$d/save/lm" --metrics-out "$d/m$r.jsonl" \
        2>>"$d/r$r.log" &
    eval "R$r=\$!"
done
wait_until "rank 0 to log step 12 ($d)" 300 logged_step_ "$d/m0.jsonl" 12 "$R0"
kill -STOP "$q1"
t0=$(date +%s)
rc0=0 rc1=0
wait "$R0" || rc0=$?
wait "$R1" || rc1=$?
took=$(($(date +%s) - t0))
kill -CONT "$q1"
stop_clean "$q0" "stall3: ferry-ps 0" "$TMP/stall3-ps0.log"
stop_clean "$q1" "stall3: ferry-ps 1 (frozen, then let go)" "$TMP/stall3-ps1.log"
# Not 0, and no signal: each rank gave up with an error of its own.
[ "$rc0" -ne 0 ] && [ "$rc1" -ne 0 ] && [ "$rc0" -lt 128 ] && [ "$rc1" -lt 128 ] ||
    fail "a stall past --recovery-timeout: ranks exited $rc0 and $rc1"
for r in 0 1; do
    grep -q "recovery failed after .*--recovery-timeout 4" "$d/r$r.log" ||
        fail "a stall past --recovery-timeout: rank $r has no clear error: $(tail -3 "$d/r$r.log")"
done
ok "server 1 frozen past --recovery-timeout 4: both ranks stopped after $took s with '$(grep -o 'recovery failed after.*' "$d/r0.log" | head -1 | cut -c1-110)'"

# ---- a stopped job resumed over damaged or mismatched checkpoints ----------------------
# resume_job DIR MAXSTEPS [PS1-FLAG...]: 2 servers on DIR's checkpoint directories (the
# second with the extra flags) and 2 ranks resuming from DIR/save, to MAXSTEPS.
resume_job() {
    local dir=$1 max=$2
    shift 2
    local p0 p1 q0 q1 rc=0
    start_ps "$(basename "$dir")-rs0" --checkpoint-dir "$dir/ck0" --checkpoint-keep 20
    p0=$PORT q0=$PS_PID
    start_ps "$(basename "$dir")-rs1" --checkpoint-dir "$dir/ck1" --checkpoint-keep 20 "$@"
    p1=$PORT q1=$PS_PID
    for r in 0 1; do
        "$TRAINER" --ps "127.0.0.1:$p0,127.0.0.1:$p1" --job rec --world 2 --rank "$r" \
            "${DATA[@]}" --max-steps "$max" --save "$dir/save/lm" \
            --metrics-out "$dir/m$r.jsonl" 2>>"$dir/r$r.log" &
        eval "R$r=\$!"
    done
    wait "$R0" || rc=$?
    wait "$R1" || rc=$?
    stop_clean "$q0" "$dir: ferry-ps 0" "$TMP/$(basename "$dir")-rs0.log"
    stop_clean "$q1" "$dir: ferry-ps 1" "$TMP/$(basename "$dir")-rs1.log"
    return "$rc"
}
half=("${DATA[@]}")
for i in "${!half[@]}"; do [ "${half[$i]}" = "$STEPS" ] && [ "${half[$((i - 1))]}" = --max-steps ] && half[$i]=20; done
FULL=("${DATA[@]}")
DATA=("${half[@]}")
for damage in flip truncate delete part; do
    d=$TMP/dmg-$damage
    run_job "$d"
    f=$d/ck1/rec-step20.ckpt
    case $damage in
    flip) printf '\xff' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") / 2)) conv=notrunc 2>/dev/null ;;
    truncate) truncate -s $(($(stat -c %s "$f") - 100)) "$f" ;;
    delete) rm "$f" ;;
    part) f=$d/save/lm.r1.20; printf '\x01' | dd of="$f" bs=1 seek=200 conv=notrunc 2>/dev/null ;;
    esac
    DATA=("${FULL[@]}")
    resume_job "$d" "$STEPS" || fail "$damage: the resumed job failed: $(tail -3 "$d/r0.log")"
    DATA=("${half[@]}")
    grep -q "rolled back to step 15" "$d/r0.log" ||
        fail "$damage: not resumed from step 15: $(grep -i 'roll\|recover' "$d/r0.log" | tail -3)"
    if [ "$damage" != delete ]; then
        named=$(grep -h "$(basename "$f")" "$TMP"/dmg-"$damage"-*.log "$d"/*.log || true)
        grep -q "CRC\|truncated" <<<"$named" ||
            fail "$damage: no log line names $(basename "$f") and what is wrong: $(cat "$TMP"/dmg-"$damage"-*.log "$d"/*.log | grep -i "usable\|skipping" | head -3)"
    fi
    same_as_ref "$d" "resumed over a damaged step-20 checkpoint ($damage)"
    ok "step-20 checkpoint damaged ($damage): the job resumed from step 15, named the bad file, and ended bit-identical"
done

# Mismatch: server 1 comes back at an older step (--restore of step 10), then fresh.
d=$TMP/mismatch
run_job "$d"
DATA=("${FULL[@]}")
resume_job "$d" "$STEPS" --restore "$d/ck1/rec-step10.ckpt" || fail "older shard: $(tail -3 "$d/r0.log")"
grep -q "server 1 (.*) is at step 10" "$d/r0.log" || fail "older shard not reported: $(grep recovery "$d/r0.log")"
grep -q "rolled back to step 20" "$d/r0.log" || fail "older shard: not rolled to step 20"
same_as_ref "$d" "older shard"
ok "a shard restored at step 10 under ranks at step 20: reported, rolled to step 20, bit-identical"
# A shard that ran ahead: both ranks lose their step-20 parts, so they resume from
# step 15 while the servers came back at step 20; the job rolls back to 15.
d=$TMP/ahead
DATA=("${half[@]}")
run_job "$d"
rm "$d/save/lm.r0.20" "$d/save/lm.r1.20"
DATA=("${FULL[@]}")
resume_job "$d" "$STEPS" || fail "shard ahead: $(tail -3 "$d/r0.log")"
grep -q "server 1 (.*) is at step 20" "$d/r0.log" || fail "shard ahead not reported: $(grep recovery "$d/r0.log")"
grep -q "rolled back to step 15" "$d/r0.log" || fail "shard ahead: not rolled to step 15"
same_as_ref "$d" "shard ahead"
ok "shards at step 20 under ranks resuming from step 15: reported, rolled back to 15, bit-identical"
d=$TMP/mismatch
rm -rf "$d/ck1" && mkdir "$d/ck1"
rc=0
resume_job "$d" "$STEPS" || rc=$?
[ "$rc" -ne 0 ] || fail "a fresh shard without checkpoints: the job went on"
grep -q "recovery impossible: no checkpoint that this rank" "$d/r0.log" ||
    fail "fresh shard: no clear error: $(tail -4 "$d/r0.log")"
grep -q "is fresh" "$d/r0.log" || fail "fresh shard not reported: $(grep recovery "$d/r0.log" | tail -4)"
ok "a fresh shard with no checkpoint: reported, and the ranks stop with a clear error"

# ---- model parallel: a crashed server that hosts LSTM layers -----------------------------
# One trainer in a job (--world 1) with 3 layers, layer 0 on ferry-ps 0, layer 1 on
# ferry-ps 1 (Stiefel-constrained, as the trainer's own), layer 2 local, 2 micro-batches,
# dropout on. Each server in turn (its LSTM layer, its embedding and decoder shards,
# their optimizer state and the carried hidden state of the trainer's stream) is
# SIGKILLed at a random step and started again: the job must roll back and finish
# bit-identical to the undisturbed run.
SDATA=("${DATA[@]}" --nlayers 3 --stages ps0:1,ps1:1,local:1 --micro-batches 2 --stiefel 0.5)
run_stages() {
    local dir=$1 at=${2:-0} v=${3:-1}
    mkdir -p "$dir/ck0" "$dir/ck1" "$dir/save"
    local -a ports pspid
    for s in 0 1; do
        start_ps "$(basename "$dir")-ps$s" --checkpoint-dir "$dir/ck$s" --checkpoint-keep 20 \
            --context-ttl 30
        ports[$s]=$PORT
        pspid[$s]=$PS_PID
    done
    "$TRAINER" --ps "127.0.0.1:${ports[0]},127.0.0.1:${ports[1]}" --job rec --world 1 --rank 0 \
        "${SDATA[@]}" --save "$dir/save/lm" --metrics-out "$dir/m0.jsonl" 2>>"$dir/r0.log" &
    local r=$!
    if [ "$at" -gt 0 ]; then
        wait_until "the trainer to log step $at ($dir)" 300 logged_step_ "$dir/m0.jsonl" "$at" "$r"
        kill -9 "${pspid[$v]}"
        reap_killed "${pspid[$v]}" "$dir: ferry-ps $v"
        "$PS" --listen "127.0.0.1:${ports[$v]}" --checkpoint-dir "$dir/ck$v" --checkpoint-keep 20 \
            --context-ttl 30 2>>"$TMP/$(basename "$dir")-ps$v.log" &
        pspid[$v]=$!
    fi
    local rc=0
    wait "$r" || rc=$?
    [ "$rc" = 0 ] || fail "$dir: the trainer exited $rc: $(tail -5 "$dir/r0.log")"
    for s in 0 1; do
        stop_clean "${pspid[$s]}" "$dir: ferry-ps $s" "$TMP/$(basename "$dir")-ps$s.log"
    done
}
run_stages "$TMP/sref"
grep -q "stages: embedding and decoder on the servers, layer 0 127.0.0.1:[0-9]*, layer 1 127.0.0.1:[0-9]*, layer 2 here" "$TMP/sref/r0.log" ||
    fail "stages: no placement line: $(grep stages "$TMP/sref/r0.log" | head -2)"
for v in 0 1; do
    at=$((3 + RANDOM % (STEPS - 8)))
    d=$TMP/skill$v
    run_stages "$d" "$at" "$v"
    grep -q "recovered in" "$d/r0.log" ||
        fail "stages: the trainer never recovered from server $v's crash at step $at: $(tail -4 "$d/r0.log")"
    check_rollback "$d" "stages: ps$v killed at step $at"
    for s in 0 1; do
        cmp -s "$TMP/sref/ck$s/rec-step$STEPS.ckpt" "$d/ck$s/rec-step$STEPS.ckpt" ||
            fail "stages: server $s's state at step $STEPS differs from the undisturbed run (ps$v killed at $at)"
    done
    cmp -s "$TMP/sref/save/lm.r0.$STEPS" "$d/save/lm.r0.$STEPS" ||
        fail "stages: the trainer's part at step $STEPS differs from the undisturbed run (ps$v killed at $at)"
    a=$(train_losses "$TMP/sref/m0.jsonl" | tail -1)
    b=$(train_losses "$d/m0.jsonl" | tail -1)
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "stages: last loss $b, undisturbed $a (ps$v killed at $at)"
    ok "model parallel (layer 0 on ps0, Stiefel layer 1 on ps1, layer 2 local, M=2): ps$v SIGKILLed at step $at (last step before the failure: $LF), rolled back to step $ROLLED, bit-identical"
done

# ---- checkpoints that are not this model's, or not this format ---------------------------
expect_error "ferry-ps --restore of a trainer's file" "is not a FERRYPS3 file (bad magic)" \
    "$PS" --listen 127.0.0.1:0 --restore "$TMP/ref/save/lm.r0.$STEPS"
cp "$TMP/ref/ck0/rec-step$STEPS.ckpt" "$TMP/v9.ckpt"
printf '\x09' | dd of="$TMP/v9.ckpt" bs=1 seek=8 conv=notrunc 2>/dev/null
expect_error "ferry-ps --restore of another format version" "format 9, this build reads format 3" \
    "$PS" --listen 127.0.0.1:0 --restore "$TMP/v9.ckpt"
cp "$TMP/ref/ck0/rec-step$STEPS.ckpt" "$TMP/v2.ckpt"
printf 'FERRYPS2' | dd of="$TMP/v2.ckpt" bs=1 seek=0 conv=notrunc 2>/dev/null
expect_error "ferry-ps --restore of a checkpoint from before ferry.v1" \
    "is a ferry-ps checkpoint of format 2, written before the ferry.v1 contract" \
    "$PS" --listen 127.0.0.1:0 --restore "$TMP/v2.ckpt"
mkdir -p "$TMP/other" "$TMP/other-ck"
start_ps other --restore "$TMP/ref/ck0/rec-step$STEPS.ckpt" --checkpoint-dir "$TMP/other-ck"
expect_error "a job of another model over a restored ferry-ps" \
    "module 'rec/encoder' already exists with a different config" \
    "$TRAINER" --ps "127.0.0.1:$PORT" --job rec "${DATA[@]}" --nhid 64 --max-steps 3 \
    --save "$TMP/other/lm"
stop_clean "$PS_PID" "the restored ferry-ps" "$TMP/other.log"

finish
