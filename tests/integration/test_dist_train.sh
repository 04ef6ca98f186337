#!/usr/bin/env bash
# ferry-ps + ferry-trainer as separate processes on 127.0.0.1: a few hundred steps
# on a PTB slice in each decoder mode must take the loss well below ln V; both
# daemons must exit 0 on SIGTERM. Pipelined (--micro-batches), the trainer logs the
# pipeline and its losses follow the unpipelined run's; BLAS threads are placed
# beside the local server.
. "$(dirname "$0")/lib.sh"

start_daemon() { # start_daemon NAME: a ferry-ps on an ephemeral port; sets PS_PID, PORT
    start_ps "$1" --shutdown-grace-ms 500
}

stop_ps() { # SIGTERM and a clean exit 0
    kill -TERM "$PS_PID"
    local rc=0
    wait "$PS_PID" || rc=$?
    [ "$rc" -eq 0 ] || fail "ferry-ps exited $rc on SIGTERM: $(tail -3 "$TMP/$1.log")"
}

# 300 steps (loss well below ln V = 9.21); a sanitized build (several times slower)
# trains 100, the loss down by 0.3 at least, and evaluates less.
STEPS300=300 EVAL_TOKENS=20000 BELOW=6.8 LOGI=50
[ -n "${FERRY_SANITIZE:-}" ] && STEPS300=100 EVAL_TOKENS=5000 BELOW= LOGI=10
# The comparisons below train N = 60 steps, logging every LI (and LI2) steps, and
# resume at N / 2; a sanitized build trains half as far (3 and 6 losses either way).
N=60 LI=20 LI2=10
[ -n "${FERRY_SANITIZE:-}" ] && N=30 LI=10 LI2=5
H=$((N / 2))
for mode in sharded-softmax logits; do
    start_daemon "ps-$mode"
    "$TRAINER" --ps "127.0.0.1:$PORT" --decoder-mode "$mode" --data "$FERRY_SRC/data/ptb" \
        --train-tokens 130000 --eval-tokens "$EVAL_TOKENS" --epochs 1 --max-steps "$STEPS300" \
        --log-interval "$LOGI" --metrics-out "$TMP/m-$mode.jsonl" 2>"$TMP/t-$mode.log" ||
        fail "$mode: trainer exited $?: $(tail -5 "$TMP/t-$mode.log")"
    first=$(train_losses "$TMP/m-$mode.jsonl" | head -1)
    last=$(train_losses "$TMP/m-$mode.jsonl" | tail -1)
    awk -v f="$first" -v l="$last" -v below="$BELOW" \
        'BEGIN { exit !(f > l && (below == "" ? l < f - 0.3 : l < below + 0)) }' ||
        fail "$mode: loss did not fall well below ln V: $first -> $last"
    grep -q "epoch 1 valid: loss" "$TMP/t-$mode.log" || fail "$mode: no validation"
    ok "$mode: $STEPS300 distributed steps, loss $first -> $last"
    stop_ps "ps-$mode"
    ok "$mode: ferry-ps exited 0 on SIGTERM"
done

# Pipelined: 4 micro-batches of 5 time steps, against the unpipelined run on a fresh
# server (same seed, dropout on): the losses agree to the log's precision (the
# in-process check to 1e-5 is tests/test_pipeline.c), the progress line and the
# metrics file show each stage's busy fraction, and --threads 2 beside a ferry-ps
# on this machine's 2 cores is held to the core the server leaves.
for m in 1 4; do
    start_daemon "ps-m$m"
    FERRY_PIPE_TRACE=$([ "$m" = 4 ] && echo "$LI" || echo 0) "$TRAINER" --ps "127.0.0.1:$PORT" --micro-batches "$m" --data "$FERRY_SRC/data/ptb" \
        --train-tokens 60000 --eval-tokens 5000 --epochs 1 --max-steps "$N" --log-interval "$LI" \
        --threads 2 --lr 0.1 --progress plain --metrics-out "$TMP/m-m$m.jsonl" 2>"$TMP/t-m$m.log" ||
        fail "--micro-batches $m: trainer exited $?: $(tail -5 "$TMP/t-m$m.log")"
    stop_ps "ps-m$m"
done
paste <(train_losses "$TMP/m-m1.jsonl") <(train_losses "$TMP/m-m4.jsonl") |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad = 1; n++ }
         END { exit !(n == 3 && !bad) }' ||
    fail "pipelined losses differ: $(paste <(train_losses "$TMP/m-m1.jsonl") <(train_losses "$TMP/m-m4.jsonl"))"
grep -q "pipeline: 4 micro-batches of 5-5 time steps" "$TMP/t-m4.log" || fail "no pipeline line"
grep -q "pipeline: step $N | 4 micro-batches | trainer busy" "$TMP/t-m4.log" ||
    fail "no pipeline stats: $(grep pipeline "$TMP/t-m4.log")"
grep -q "ps [0-9]*% bubble [0-9]*%" "$TMP/t-m4.log" || fail "the progress line lacks the pipeline"
grep -q "\"event\":\"pipeline\",\"step\":$N,\"micro_batches\":4,\"trainer_busy\"" "$TMP/m-m4.jsonl" ||
    fail "no pipeline event in the metrics file"
nthreads="1 thread (not the 2 of --threads: 1 ferry-ps on this machine uses"
if [ "$(nproc)" -eq 2 ]; then
    grep -qF "$nthreads" "$TMP/t-m4.log" || fail "threads not placed: $(grep OpenBLAS "$TMP/t-m4.log")"
fi
# FERRY_PIPE_TRACE=$LI: every LI-th step's timeline, whose spans keep the pipeline's
# order: the trainer's forwards in turn, each chunk's decoder Forward after the
# trainer's forward of it, its Backward after the Forward of the last chunk, the
# trainer's backward of a chunk after its dh came back, last chunk first.
[ "$(grep -c 'pipeline: timeline of pipelined step [0-9]* (ms): weight gradients' "$TMP/t-m4.log")" = 3 ] ||
    fail "FERRY_PIPE_TRACE=$LI: not 3 timelines: $(grep timeline "$TMP/t-m4.log")"
grep "pipeline: timeline of pipelined step $N, chunk " "$TMP/t-m4.log" | sed 's/.*, chunk //' |
    awk -v M=4 '{ split($1, cm, "/"); c = cm[1]; chunks++
                  for (i = 3; i < NF; i += 2) {
                      name = $i c; split($(i + 1), t, "-"); s[name] = t[1] + 0; e[name] = t[2] + 0
                      if (s[name] > e[name]) bad = bad " " name " ends before it starts" } }
        END {
            n = 0; for (k in s) n++
            if (chunks != M || n != 5 * M) bad = bad " " chunks " chunks, " n " spans, not " M ", " 5 * M
            for (c = 0; c < M; c++) {
                if (c > 0 && s["F" c] < e["F" c - 1]) bad = bad " F" c " before F" c - 1 " ended"
                if (s["D" c] < e["F" c]) bad = bad " D" c " before F" c " ended"
                if (s["d" c] < e["D" M - 1]) bad = bad " d" c " before D" M - 1 " ended"
                if (s["B" c] < e["d" c]) bad = bad " B" c " before its dh (d" c ")"
                if (s["B" c] < e["wait" c]) bad = bad " B" c " before its wait ended"
                if (c < M - 1 && s["B" c] < e["B" c + 1]) bad = bad " B" c " before B" c + 1
            }
            if (bad != "") { print bad; exit 1 }
        }' >"$TMP/timeline.err" ||
    fail "the step-$N timeline is out of order:$(cat "$TMP/timeline.err"): $(grep "step $N," "$TMP/t-m4.log" | grep timeline)"
ok "--micro-batches 4: losses as unpipelined ($(train_losses "$TMP/m-m4.jsonl" | tail -1)), $(grep -o 'trainer busy.*bubble [0-9]*%' "$TMP/t-m4.log" | tail -1); FERRY_PIPE_TRACE's timelines in the pipeline's order"
expect_error "--micro-batches without --ps" "needs --ps" \
    "$TRAINER" --micro-batches 2 --data "$FERRY_SRC/data/ptb" --max-steps 1
start_daemon ps-mbad
expect_error "more micro-batches than time steps" "at most one micro-batch per step" \
    "$TRAINER" --ps "127.0.0.1:$PORT" --micro-batches 30 --bptt 20 --data "$FERRY_SRC/data/ptb" \
    --max-steps 1
stop_ps ps-mbad

# Model parallel: a 4-layer LSTM with layer 0 on one ferry-ps, layer 1 on another and
# layers 2-3 in the trainer trains as the local trainer does (dropout off, same seed:
# losses within 1e-5 relative; the in-process check of every parameter is
# tests/test_stages.c).
start_daemon ps-s0; S0=$PORT; S0_PID=$PS_PID
start_daemon ps-s1; S1=$PORT
common=(--nlayers 4 --emsize 64 --nhid 64 --dropout 0 --data "$FERRY_SRC/data/ptb"
        --train-tokens 60000 --eval-tokens 5000 --epochs 1 --max-steps "$N" --log-interval "$LI"
        --lr 0.1 --progress plain)
"$TRAINER" --ps "127.0.0.1:$S0,127.0.0.1:$S1" --stages ps0:1,ps1:1,local:2 "${common[@]}" \
    --metrics-out "$TMP/m-stages.jsonl" 2>"$TMP/t-stages.log" ||
    fail "--stages: trainer exited $?: $(tail -5 "$TMP/t-stages.log")"
"$TRAINER" --local "${common[@]}" --metrics-out "$TMP/m-stages-local.jsonl" \
    2>"$TMP/t-stages-local.log" || fail "local 4-layer trainer exited $?"
paste <(train_losses "$TMP/m-stages-local.jsonl") <(train_losses "$TMP/m-stages.jsonl") |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad = 1; n++ }
         END { exit !(n == 3 && !bad) }' ||
    fail "model-parallel losses differ from the local trainer's: $(paste <(train_losses "$TMP/m-stages-local.jsonl") <(train_losses "$TMP/m-stages.jsonl"))"
grep -q "stages: embedding and decoder on the servers, layer 0 127.0.0.1:$S0, layer 1 127.0.0.1:$S1, layers 2-3 here" "$TMP/t-stages.log" ||
    fail "no stages line: $(grep stages "$TMP/t-stages.log")"
ok "--stages ps0:1,ps1:1,local:2: 4-layer losses as the local trainer's ($(train_losses "$TMP/m-stages.jsonl" | tail -1))"
expect_error "--stages placing too few layers" "places 3 of the 4 layers" \
    "$TRAINER" --ps "127.0.0.1:$S0,127.0.0.1:$S1" --stages ps0:1,local:2 --nlayers 4 \
    --data "$FERRY_SRC/data/ptb" --max-steps 1
expect_error "--stages without --ps" "needs --ps" \
    "$TRAINER" --stages ps0:2 --data "$FERRY_SRC/data/ptb" --max-steps 1
stop_ps ps-s1
PS_PID=$S0_PID stop_ps ps-s0

# A split model checkpoints and resumes exactly: 3 layers (0 and 1 on the servers,
# Stiefel-constrained, dropout on), --save at step 30, both servers restarted from
# their checkpoint directories, --load (and --save) to step 60: the losses of the
# uninterrupted run, and at step 60 the trainer's part and both servers' checkpoints
# those of an uninterrupted run with --save, bit for bit (with --ps, --save makes the
# run a job: the run without it is another code path, compared on losses).
split=(--nlayers 3 --emsize 64 --nhid 64 --dropout 0.3 --stiefel 0.1 --lr 0.5
       --data "$FERRY_SRC/data/ptb" --train-tokens 60000 --eval-tokens 5000 --epochs 1
       --log-interval "$LI2" --progress off)
split_ps() { # split_ps TAG DIR: two servers on DIR/0, DIR/1; sets SPS and SPIDS
    mkdir -p "$2/0" "$2/1"
    start_daemon_ck "$1-0" "$2/0"; SPS="127.0.0.1:$PORT"; SPIDS=$PS_PID
    start_daemon_ck "$1-1" "$2/1"; SPS="$SPS,127.0.0.1:$PORT"; SPIDS="$SPIDS $PS_PID"
}
start_daemon_ck() { start_ps "$1" --shutdown-grace-ms 500 --checkpoint-dir "$2"; }
newest_ckpt() { ls -t "$1"/*.ckpt | head -1; } # newest_ckpt DIR: its newest checkpoint
split_stop() { # both servers of split_ps, each exiting 0 on SIGTERM
    local p
    for p in $SPIDS; do
        stop_clean "$p" "a ferry-ps of split_ps ($SPS)"
    done
}
split_ps sa "$TMP/ck-a"
"$TRAINER" --ps "$SPS" --stages ps0:1,ps1:1,local:1 "${split[@]}" --max-steps "$N" \
    --metrics-out "$TMP/m-split-a.jsonl" 2>"$TMP/t-split-a.log" ||
    fail "split run exited $?: $(tail -3 "$TMP/t-split-a.log")"
split_stop
split_ps sa2 "$TMP/ck-a2"
"$TRAINER" --ps "$SPS" --stages ps0:1,ps1:1,local:1 "${split[@]}" --max-steps "$N" \
    --save "$TMP/split-a2.ck" --metrics-out "$TMP/m-split-a2.jsonl" 2>"$TMP/t-split-a2.log" ||
    fail "split run with --save exited $?: $(tail -3 "$TMP/t-split-a2.log")"
split_stop
split_ps sb "$TMP/ck-b"
"$TRAINER" --ps "$SPS" --stages ps0:1,ps1:1,local:1 "${split[@]}" --max-steps "$H" \
    --save "$TMP/split.ck" --metrics-out "$TMP/m-split-b.jsonl" 2>"$TMP/t-split-b1.log" ||
    fail "split run to step $H exited $?: $(tail -3 "$TMP/t-split-b1.log")"
split_stop
split_ps sc "$TMP/ck-b"
"$TRAINER" --ps "$SPS" --load "$TMP/split.ck" --data "$FERRY_SRC/data/ptb" --max-steps "$N" \
    --save "$TMP/split.ck" --metrics-out "$TMP/m-split-b.jsonl" 2>"$TMP/t-split-b2.log" ||
    fail "split resume exited $?: $(tail -3 "$TMP/t-split-b2.log")"
split_stop
[ "$(train_losses "$TMP/m-split-a.jsonl")" = "$(train_losses "$TMP/m-split-b.jsonl")" ] &&
    [ "$(train_losses "$TMP/m-split-a.jsonl" | wc -l)" -eq 6 ] ||
    fail "split resume differs: $(paste <(train_losses "$TMP/m-split-a.jsonl") <(train_losses "$TMP/m-split-b.jsonl"))"
same_state "$TMP/split-a2.ck.r0.$N" "$TMP/split.ck.r0.$N" "--stages resume: the trainer's part at step $N"
for s in 0 1; do
    same_state "$(newest_ckpt "$TMP/ck-a2/$s")" "$(newest_ckpt "$TMP/ck-b/$s")" \
        "--stages resume: server $s's checkpoint at step $N"
done
ok "--stages: saved at step $H, servers restarted, resumed to $N with the uninterrupted losses and state (trainer and servers, bit for bit)"

# A pipeline is one replica of a data-parallel job: 2 ranks of a bsp job of 4 layers,
# each with layers 0-1 on server 1 (one module, shared: the ranks' gradients are summed
# there, and the dropout between its layers is drawn there), layer 2 on server 0,
# layer 3 in the trainer, 2 micro-batches. Both finish and log the job's same loss,
# the local trainer's (dropout 0.3: the servers' layers too draw each rank's columns
# of the whole batch's masks; Stiefel on).
split_ps sj "$TMP/ck-j"
for r in 0 1; do
    "$TRAINER" --ps "$SPS" --job split2 --world 2 --rank "$r" --stages ps1:2,ps0:1,local:1 \
        --micro-batches 2 "${split[@]}" --nlayers 4 --max-steps "$((2 * LI2))" --metrics-out "$TMP/m-sj$r.jsonl" \
        2>"$TMP/t-sj$r.log" &
    eval "SJ$r=\$!"
done
wait "$SJ0" || fail "stages in a 2-rank job: rank 0 exited $?: $(tail -3 "$TMP/t-sj0.log")"
wait "$SJ1" || fail "stages in a 2-rank job: rank 1 exited $?: $(tail -3 "$TMP/t-sj1.log")"
split_stop
[ "$(train_losses "$TMP/m-sj0.jsonl" | wc -l)" -eq 2 ] &&
    [ "$(train_losses "$TMP/m-sj0.jsonl")" = "$(train_losses "$TMP/m-sj1.jsonl")" ] ||
    fail "stages in a 2-rank job: the ranks' job losses differ: $(paste <(train_losses "$TMP/m-sj0.jsonl") <(train_losses "$TMP/m-sj1.jsonl"))"
"$TRAINER" --local "${split[@]}" --nlayers 4 --max-steps "$((2 * LI2))" --metrics-out "$TMP/m-sj-local.jsonl" \
    2>"$TMP/t-sj-local.log" || fail "local 3-layer trainer exited $?"
# Steps 1-10 within 1e-5 relative (wrong masks: 2e-4 at once); by step 20, with 4
# layers, lr 0.5 and Stiefel, the other summation order has drifted to about 1.3e-5:
# 1e-4 there.
paste <(train_losses "$TMP/m-sj-local.jsonl") <(train_losses "$TMP/m-sj0.jsonl") |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > (NR == 1 ? 1e-5 : 1e-4) * $1) bad = 1; n++ }
         END { exit !(n == 2 && !bad) }' ||
    fail "stages in a 2-rank job with dropout: losses differ from the local trainer's: $(paste <(train_losses "$TMP/m-sj-local.jsonl") <(train_losses "$TMP/m-sj0.jsonl"))"
ok "--stages ps1:2,ps0:1,local:1 --micro-batches 2 in a 2-rank bsp job, dropout 0.3: both ranks log the local trainer's losses ($(train_losses "$TMP/m-sj0.jsonl" | tail -1))"

# A slice of the decoder's vocabulary in the trainer (--local-vocab): pipelined, it
# trains as the local trainer does (dropout off: losses within 1e-5 relative); in a
# 2-rank bsp job both ranks log those losses too (the slice rides in the job's dense
# block); with dropout and Stiefel it saves at step 30 and resumes exactly to 60 (the
# uninterrupted run's losses; the state at step 60, trainer's and server's, that of an
# uninterrupted run with --save, bit for bit).
lv=(--nlayers 2 --emsize 64 --nhid 64 --data "$FERRY_SRC/data/ptb" --train-tokens 60000
    --eval-tokens 5000 --epochs 1 --log-interval "$LI" --progress off)
start_daemon ps-lv
"$TRAINER" --ps "127.0.0.1:$PORT" --local-vocab 3000 --micro-batches 2 "${lv[@]}" --dropout 0 \
    --lr 0.1 --max-steps "$N" --metrics-out "$TMP/m-lv.jsonl" 2>"$TMP/t-lv.log" ||
    fail "--local-vocab: trainer exited $?: $(tail -3 "$TMP/t-lv.log")"
grep -q "decoder: vocabulary rows 0-6999 on the servers, 7000-9999 here" "$TMP/t-lv.log" ||
    fail "no decoder placement line: $(grep decoder "$TMP/t-lv.log")"
"$TRAINER" --local "${lv[@]}" --dropout 0 --lr 0.1 --max-steps "$N" --save "$TMP/gt-off.ck" \
    --metrics-out "$TMP/m-lv-local.jsonl" 2>"$TMP/t-lv-local.log" || fail "local trainer exited $?"
# The LSTM's weight gradients on a helper thread change nothing, to the last bit: the
# same losses and, at step 60, the same state.
"$TRAINER" --local --grad-thread on "${lv[@]}" --dropout 0 --lr 0.1 --max-steps "$N" \
    --save "$TMP/gt-on.ck" --metrics-out "$TMP/m-gt-local.jsonl" 2>"$TMP/t-gt-local.log" ||
    fail "--grad-thread on exited $?"
grep -q "weight gradients form on a helper thread" "$TMP/t-gt-local.log" || fail "no helper line"
same_listing "--grad-thread on against the local trainer" "$(train_losses "$TMP/m-gt-local.jsonl")" \
    "$(train_losses "$TMP/m-lv-local.jsonl")" 3
same_state "$TMP/gt-off.ck.$N" "$TMP/gt-on.ck.$N" "--grad-thread on at step $N"
ok "--local --grad-thread on: the local trainer's losses, and at step $N its parameters and optimizer state bit for bit"
close_losses() { # close_losses A B: the same number (3) of losses, each within 1e-5
    paste <(train_losses "$1") <(train_losses "$2") |
        awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad = 1; n++ }
             END { exit !(n == 3 && !bad) }'
}
close_losses "$TMP/m-lv-local.jsonl" "$TMP/m-lv.jsonl" ||
    fail "--local-vocab losses differ from the local trainer's: $(paste <(train_losses "$TMP/m-lv-local.jsonl") <(train_losses "$TMP/m-lv.jsonl"))"
ok "--local-vocab 3000 --micro-batches 2: losses as the local trainer's ($(train_losses "$TMP/m-lv.jsonl" | tail -1))"
stop_ps ps-lv
# Unpipelined (M=1), each step pulls the slice's block while the LSTM runs and pushes
# it while the LSTM's backward runs (worker/model.c, the slice's overlap); twice, to the
# same losses and the same part at step 60 bit for bit (every server sums the modules'
# gradient norms in one order).
mkdir -p "$TMP/ck-lvj"
start_daemon_ck ps-lvj "$TMP/ck-lvj"
n=0
for M in 2 1 1; do
    n=$((n + 1)) run=lv2-$n-m$M
    for r in 0 1; do
        "$TRAINER" --ps "127.0.0.1:$PORT" --job "$run" --world 2 --rank "$r" --local-vocab 3000 \
            --micro-batches "$M" "${lv[@]}" --dropout 0 --lr 0.1 --max-steps "$N" --save "$TMP/$run" \
            --metrics-out "$TMP/m-lvj$r.jsonl" 2>"$TMP/t-lvj$r.log" &
        eval "LJ$r=\$!"
    done
    wait "$LJ0" || fail "--local-vocab in a 2-rank job (M=$M): rank 0 exited $?: $(tail -3 "$TMP/t-lvj0.log")"
    wait "$LJ1" || fail "--local-vocab in a 2-rank job (M=$M): rank 1 exited $?: $(tail -3 "$TMP/t-lvj1.log")"
    close_losses "$TMP/m-lv-local.jsonl" "$TMP/m-lvj0.jsonl" &&
        [ "$(train_losses "$TMP/m-lvj0.jsonl")" = "$(train_losses "$TMP/m-lvj1.jsonl")" ] ||
        fail "--local-vocab 2-rank job (M=$M) differs: $(paste <(train_losses "$TMP/m-lv-local.jsonl") <(train_losses "$TMP/m-lvj0.jsonl") <(train_losses "$TMP/m-lvj1.jsonl"))"
    grep -q "% in pull/push" "$TMP/t-lvj0.log" || fail "M=$M: no pull/push share: $(grep "rank 0" "$TMP/t-lvj0.log" | tail -1)"
    if [ "$M" = 1 ] && [ -n "${LVJ_FIRST:-}" ]; then
        [ "$(train_losses "$TMP/m-lvj0.jsonl")" = "$LVJ_FIRST" ] ||
            fail "the overlapped job is not reproducible: $LVJ_FIRST against $(train_losses "$TMP/m-lvj0.jsonl")"
        same_state "$TMP/$LVJ_RUN.r0.$N" "$TMP/$run.r0.$N" "the overlapped job's rank 0 part, run twice"
    elif [ "$M" = 1 ]; then
        LVJ_FIRST=$(train_losses "$TMP/m-lvj0.jsonl") LVJ_RUN=$run
    fi
done
ok "--local-vocab in a 2-rank bsp job (10 columns each), pipelined and with the slice's transfer overlapped: the local trainer's losses on both ranks; the overlapped job twice, bit for bit"
# Dropout in a data-parallel job: each rank's masks are its columns of the masks the
# whole batch draws, so a 2-rank job, unpipelined and with --micro-batches 2, trains as
# the local trainer does with dropout on (losses within 1e-5 relative).
"$TRAINER" --local "${lv[@]}" --dropout 0.3 --lr 0.1 --max-steps "$N" \
    --metrics-out "$TMP/m-dl.jsonl" 2>"$TMP/t-dl.log" || fail "local trainer with dropout exited $?"
for mb in 1 2; do
    for r in 0 1; do
        "$TRAINER" --ps "127.0.0.1:$PORT" --job "dj$mb" --world 2 --rank "$r" --micro-batches "$mb" \
            "${lv[@]}" --dropout 0.3 --lr 0.1 --max-steps "$N" --metrics-out "$TMP/m-dj$mb-$r.jsonl" \
            2>"$TMP/t-dj$mb-$r.log" &
        eval "DJ$r=\$!"
    done
    wait "$DJ0" || fail "dropout, 2-rank job: rank 0 exited $?: $(tail -3 "$TMP/t-dj$mb-0.log")"
    wait "$DJ1" || fail "dropout, 2-rank job: rank 1 exited $?: $(tail -3 "$TMP/t-dj$mb-1.log")"
    close_losses "$TMP/m-dl.jsonl" "$TMP/m-dj$mb-0.jsonl" ||
        fail "dropout 0.3, 2-rank job (--micro-batches $mb): losses differ from the local trainer's: $(paste <(train_losses "$TMP/m-dl.jsonl") <(train_losses "$TMP/m-dj$mb-0.jsonl"))"
done
ok "dropout 0.3 in a 2-rank bsp job, unpipelined and --micro-batches 2: the local trainer's losses ($(train_losses "$TMP/m-dl.jsonl" | tail -1))"
stop_ps ps-lvj
lvs=("${lv[@]}" --dropout 0.3 --stiefel 0.1 --lr 0.5 --local-vocab 3000 --micro-batches 2)
mkdir -p "$TMP/ck-lva" "$TMP/ck-lvb"
start_daemon_ck lva "$TMP/ck-lva"
"$TRAINER" --ps "127.0.0.1:$PORT" "${lvs[@]}" --max-steps "$N" --log-interval "$LI2" \
    --metrics-out "$TMP/m-lva.jsonl" 2>"$TMP/t-lva.log" ||
    fail "--local-vocab run exited $?: $(tail -3 "$TMP/t-lva.log")"
stop_ps lva
mkdir -p "$TMP/ck-lva2"
start_daemon_ck lva2 "$TMP/ck-lva2"
"$TRAINER" --ps "127.0.0.1:$PORT" "${lvs[@]}" --max-steps "$N" --log-interval "$LI2" \
    --save "$TMP/lva2.ck" --metrics-out "$TMP/m-lva2.jsonl" 2>"$TMP/t-lva2.log" ||
    fail "--local-vocab run with --save exited $?: $(tail -3 "$TMP/t-lva2.log")"
stop_ps lva2
start_daemon_ck lvb "$TMP/ck-lvb"
"$TRAINER" --ps "127.0.0.1:$PORT" "${lvs[@]}" --max-steps "$H" --log-interval "$LI2" \
    --save "$TMP/lv.ck" --metrics-out "$TMP/m-lvb.jsonl" 2>"$TMP/t-lvb1.log" ||
    fail "--local-vocab run to step $H exited $?: $(tail -3 "$TMP/t-lvb1.log")"
stop_ps lvb
start_daemon_ck lvc "$TMP/ck-lvb"
"$TRAINER" --ps "127.0.0.1:$PORT" --load "$TMP/lv.ck" --micro-batches 2 \
    --data "$FERRY_SRC/data/ptb" --max-steps "$N" --save "$TMP/lv.ck" \
    --metrics-out "$TMP/m-lvb.jsonl" \
    2>"$TMP/t-lvb2.log" || fail "--local-vocab resume exited $?: $(tail -3 "$TMP/t-lvb2.log")"
stop_ps lvc
[ "$(train_losses "$TMP/m-lva.jsonl")" = "$(train_losses "$TMP/m-lvb.jsonl")" ] &&
    [ "$(train_losses "$TMP/m-lva.jsonl" | wc -l)" -eq 6 ] ||
    fail "--local-vocab resume differs: $(paste <(train_losses "$TMP/m-lva.jsonl") <(train_losses "$TMP/m-lvb.jsonl"))"
same_state "$TMP/lva2.ck.r0.$N" "$TMP/lv.ck.r0.$N" "--local-vocab resume: the trainer's part at step $N"
same_state "$(newest_ckpt "$TMP/ck-lva2")" "$(newest_ckpt "$TMP/ck-lvb")" \
    "--local-vocab resume: the server's checkpoint at step $N"
ok "--local-vocab: saved at step $H (the slice in the trainer's part), resumed to $N exactly (losses, and the trainer's and the server's state bit for bit)"
expect_error "--local-vocab without --ps" "needs --ps" \
    "$TRAINER" --local-vocab 10 --data "$FERRY_SRC/data/ptb" --max-steps 1

# The trainer stops cleanly on SIGTERM mid-epoch too (and checkpoints).
mkdir -p "$TMP/ck-sig"
start_daemon_ck ps-sig "$TMP/ck-sig"
"$TRAINER" --ps "127.0.0.1:$PORT" --data "$FERRY_SRC/data/ptb" --log-interval 5 \
    --save "$TMP/sig.ck" 2>"$TMP/t-sig.log" &
TPID=$!
wait_until "the trainer to reach step 10" 300 logged "$TMP/t-sig.log" "step 10/" "$TPID"
kill -TERM "$TPID"
rc=0
wait "$TPID" || rc=$?
[ "$rc" -eq 0 ] || fail "trainer exited $rc on SIGTERM: $(tail -3 "$TMP/t-sig.log")"
grep -q "stopping on signal" "$TMP/t-sig.log" || fail "no stop line"
ls "$TMP"/sig.ck.r0.* >/dev/null 2>&1 || fail "no checkpoint on SIGTERM: $(ls "$TMP")"
ok "ferry-trainer exited 0 on SIGTERM with a checkpoint"
stop_ps ps-sig
finish
