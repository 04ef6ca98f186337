#!/usr/bin/env bash
# A job moved to another number of servers (ferry-ctl reshard), end to end: a bsp job of
# 2 trainers on 2 ferry-ps, checkpointed every 10 steps, is the reference (40 steps).
#
# - 2 -> 3: its step-20 server files are cut for 3 servers; the job resumes there with
#   the ranks' --load and runs to step 40. Every step's loss is within 1e-5 of the
#   reference's (only the order in which the servers' partial sums add up differs).
# - 3 -> 2: that run's step-30 files are cut back for 2 servers; resumed, steps 31-40
#   again within 1e-5 of the reference.
# - Exact: the step-20 files cut 2 -> 3 -> 2 hold, module for module, the bytes of
#   the originals (configuration, version, parameters, optimizer state).
# - Bad input is refused in one line: files of different steps, files out of server
#   order, a server's file left out, a file that is not a checkpoint, a module that
#   lives whole on one server (--stages layers), a new server's directory that holds a
#   source or is listed twice, no --into; nothing is written then.
. "$(dirname "$0")/lib.sh"
CTL=$FERRY_BIN/server/ferry-ctl
DATA=(--data "$FERRY_SRC/data/ptb" --train-tokens 8000 --eval-tokens 400 --epochs 1
    --emsize 32 --nhid 32 --bptt 10 --batch-size 4 --dropout 0.3 --seed 7 --optimizer adam --lr 0.01
    --max-steps 40 --checkpoint-every 10 --log-interval 1 --progress off --deadline-ms 10000)

# servers DIR N: N ferry-ps on DIR/ck0..N-1; sets PSS (their --ps) and PIDS.
servers() {
    local s
    PSS="" PIDS=()
    for ((s = 0; s < $2; s++)); do
        mkdir -p "$1/ck$s"
        start_ps "$(basename "$1")-ps$s" --checkpoint-dir "$1/ck$s" --checkpoint-keep 20
        PSS=$PSS${PSS:+,}127.0.0.1:$PORT
        PIDS+=("$PS_PID")
    done
}
stop_servers() {
    local p
    for p in "${PIDS[@]}"; do stop_clean "$p" "ferry-ps ($1)"; done
}
# ranks DIR [ARGS...]: the job's two ranks against $PSS, saving under DIR/save.
ranks() {
    local dir=$1 r
    shift
    local -a pid
    mkdir -p "$dir/save"
    for r in 0 1; do
        "$TRAINER" --ps "$PSS" --job rs --world 2 --rank "$r" "${DATA[@]}" "$@" \
            --save "$dir/save/lm" --metrics-out "$dir/m$r.jsonl" 2>>"$dir/r$r.log" &
        pid[$r]=$!
    done
    for r in 0 1; do
        wait "${pid[$r]}" || fail "$dir: rank $r exited $?: $(tail -3 "$dir/r$r.log")"
    done
}
# within DIR FROM: DIR's rank-0 losses of steps FROM..40 are within 1e-5 of the
# reference's; prints the largest difference.
within() {
    awk -v from="$2" '
        /"event":"train"/ { s = $0; sub(/.*"step":/, "", s); sub(/,.*/, "", s)
            l = $0; sub(/.*"loss":/, "", l); sub(/,.*/, "", l)
            if (FILENAME == ARGV[1]) { ref[s] = l; next }
            if (s + 0 < from) next
            if (!(s in ref)) { bad = "step " s " is not in the reference"; exit 1 }
            d = ref[s] - l; d = d < 0 ? -d : d; m = d > m ? d : m; n++ }
        END { if (bad != "") { print bad; exit 1 }
              if (n != 41 - from) { print n " steps compared, not " 41 - from; exit 1 }
              printf "%.3g", m; exit m > 1e-5 }' "$TMP/ref/m0.jsonl" "$1/m0.jsonl"
}
# resume DIR STEP FILES...: DIR's saves of STEP (both ranks) from SAVE, then the job
# resumed from them on $PSS.
resume() {
    local dir=$1 step=$2 from=$3 r
    mkdir -p "$dir/save"
    for r in 0 1; do cp "$from/save/lm.r$r.$step" "$dir/save/"; done
    ranks "$dir" --load "$dir/save/lm"
    grep -q "rolled back to step $step\|resum" "$dir/r0.log" ||
        fail "$dir: no resume at step $step: $(grep -i 'resum\|recover' "$dir/r0.log" | head -3)"
}
modl_sums() { # FILE OUT: the md5 of each module section of FILE, sorted, into OUT
    local d
    d=$(mktemp -d "$TMP/sec.XXXXXX")
    "$FERRY_BIN/tests/ferry_ck_sections" "$1" "$d" || fail "cannot read $1"
    md5sum "$d"/*MODL* | cut -d' ' -f1 | sort >"$2"
    [ "$(wc -l <"$2")" -ge 3 ] || fail "$1: fewer than 3 module sections"
    rm -rf "$d"
}

# ---- the reference: 2 servers, 40 steps ----
mkdir -p "$TMP/ref"
servers "$TMP/ref" 2
ranks "$TMP/ref"
stop_servers ref
[ "$(train_losses "$TMP/ref/m0.jsonl" | wc -l)" -eq 40 ] || fail "reference: not 40 steps"
ok "reference: 2 trainers on 2 servers, 40 steps, checkpoints every 10"

# ---- 2 -> 3 at step 20 ----
mkdir -p "$TMP/n3/ck0" "$TMP/n3/ck1" "$TMP/n3/ck2"
"$CTL" --into "$TMP/n3/ck0,$TMP/n3/ck1,$TMP/n3/ck2" reshard "$TMP/ref/ck0/rs-step20.ckpt" \
    "$TMP/ref/ck1/rs-step20.ckpt" >"$TMP/n3/reshard.txt" 2>&1 ||
    fail "reshard 2 -> 3: $(cat "$TMP/n3/reshard.txt")"
grep -q "step 20 of 2 servers cut for 3: .* MB read, .* MB written in" "$TMP/n3/reshard.txt" ||
    fail "reshard 2 -> 3 said: $(cat "$TMP/n3/reshard.txt")"
servers "$TMP/n3" 3
resume "$TMP/n3" 20 "$TMP/ref"
stop_servers n3
d=$(within "$TMP/n3" 21) || fail "2 -> 3 servers at step 20: losses of steps 21-40 differ from the reference: $d"
ok "2 -> 3 servers at step 20 ($(tail -1 "$TMP/n3/reshard.txt")): steps 21-40 within $d of the reference"

# ---- 3 -> 2 at step 30 ----
mkdir -p "$TMP/n2/ck0" "$TMP/n2/ck1"
"$CTL" --into "$TMP/n2/ck0,$TMP/n2/ck1" reshard "$TMP/n3/ck0/rs-step30.ckpt" \
    "$TMP/n3/ck1/rs-step30.ckpt" "$TMP/n3/ck2/rs-step30.ckpt" >"$TMP/n2/reshard.txt" 2>&1 ||
    fail "reshard 3 -> 2: $(cat "$TMP/n2/reshard.txt")"
servers "$TMP/n2" 2
resume "$TMP/n2" 30 "$TMP/n3"
stop_servers n2
d=$(within "$TMP/n2" 31) || fail "3 -> 2 servers at step 30: losses of steps 31-40 differ from the reference: $d"
ok "3 -> 2 servers at step 30 ($(tail -1 "$TMP/n2/reshard.txt")): steps 31-40 within $d of the reference"

# ---- exact: 2 -> 3 -> 2 gives back the original files' modules ----
mkdir -p "$TMP/rt/ck0" "$TMP/rt/ck1"
"$CTL" --into "$TMP/rt/ck0,$TMP/rt/ck1" reshard "$TMP/n3/ck0/rs-step20.ckpt" \
    "$TMP/n3/ck1/rs-step20.ckpt" "$TMP/n3/ck2/rs-step20.ckpt" >"$TMP/rt/reshard.txt" 2>&1 ||
    fail "reshard 3 -> 2 (round trip): $(cat "$TMP/rt/reshard.txt")"
for s in 0 1; do
    modl_sums "$TMP/ref/ck$s/rs-step20.ckpt" "$TMP/rt/orig$s.md5"
    modl_sums "$TMP/rt/ck$s/rs-step20.ckpt" "$TMP/rt/back$s.md5"
    cmp -s "$TMP/rt/orig$s.md5" "$TMP/rt/back$s.md5" ||
        fail "2 -> 3 -> 2: server $s's modules differ from the original's"
done
ok "2 -> 3 -> 2: every module of both servers' files byte for byte the original's"

# ---- bad input ----
mkdir -p "$TMP/x0" "$TMP/x1" "$TMP/x2"
expect_error "files of two steps" "are not the same step's files of one job" "$CTL" --into "$TMP/x0,$TMP/x1" \
    reshard "$TMP/ref/ck0/rs-step20.ckpt" "$TMP/ref/ck1/rs-step30.ckpt"
cp "$TMP/ref/ck1/rs-step30.ckpt" "$TMP/rs-step20.ckpt"
expect_error "files of two steps under one name" "must be one step's files" "$CTL" \
    --into "$TMP/x0,$TMP/x1" reshard "$TMP/ref/ck0/rs-step20.ckpt" "$TMP/rs-step20.ckpt"
expect_error "files out of server order" "in the job's server order" "$CTL" \
    --into "$TMP/x0,$TMP/x1,$TMP/x2" reshard "$TMP/ref/ck1/rs-step20.ckpt" \
    "$TMP/ref/ck0/rs-step20.ckpt"
expect_error "a server's file left out" "give every server's file of the step" "$CTL" \
    --into "$TMP/x0,$TMP/x1,$TMP/x2" reshard "$TMP/ref/ck0/rs-step20.ckpt"
expect_error "a new server's directory that holds a source" "holds the source" "$CTL" \
    --into "$TMP/x0,$TMP/ref/ck1" reshard "$TMP/ref/ck0/rs-step20.ckpt" "$TMP/ref/ck1/rs-step20.ckpt"
expect_error "a directory listed twice" "lists a directory twice" "$CTL" \
    --into "$TMP/x0,$TMP/x0" reshard "$TMP/ref/ck0/rs-step20.ckpt" "$TMP/ref/ck1/rs-step20.ckpt"
[ -z "$(find "$TMP/x0" "$TMP/x1" "$TMP/x2" -type f)" ] ||
    fail "a refused reshard wrote: $(find "$TMP/x0" "$TMP/x1" "$TMP/x2" -type f)"
# A write that fails on the last new server (a directory where its temporary file
# goes: root cannot write there either) leaves no new file anywhere, temporary ones
# included, not two servers of three; a directory where a new file goes is refused
# before anything is written.
mkdir -p "$TMP/x2/.rs-step20.ckpt.reshard-part"
expect_error "a write failing on the third new server" "reshard: cannot write checkpoint" "$CTL" \
    --into "$TMP/x0,$TMP/x1,$TMP/x2" reshard "$TMP/ref/ck0/rs-step20.ckpt" "$TMP/ref/ck1/rs-step20.ckpt"
[ -z "$(find "$TMP/x0" "$TMP/x1" "$TMP/x2" -type f)" ] ||
    fail "a reshard that failed part way left: $(find "$TMP/x0" "$TMP/x1" "$TMP/x2" -type f)"
rmdir "$TMP/x2/.rs-step20.ckpt.reshard-part"
ok "a reshard failing on the third new server's write leaves no file, new or temporary, on the other two"
mkdir -p "$TMP/x2/rs-step20.ckpt"
expect_error "a directory where the third new file goes" "exists and is not a file" "$CTL" \
    --into "$TMP/x0,$TMP/x1,$TMP/x2" reshard "$TMP/ref/ck0/rs-step20.ckpt" "$TMP/ref/ck1/rs-step20.ckpt"
[ -z "$(find "$TMP/x0" "$TMP/x1" "$TMP/x2" -type f)" ] ||
    fail "a refused reshard wrote: $(find "$TMP/x0" "$TMP/x1" "$TMP/x2" -type f)"
rmdir "$TMP/x2/rs-step20.ckpt"
mkdir -p "$TMP/bad"
head -c 100 /dev/urandom >"$TMP/bad/rs-step20.ckpt"
expect_error "a file that is not a checkpoint" "is not a FERRYPS3 file (bad magic)" "$CTL" \
    --into "$TMP/x0" reshard \
    "$TMP/ref/ck0/rs-step20.ckpt" "$TMP/bad/rs-step20.ckpt"
# A job with LSTM layers on a server (--stages): the layer module lives whole on the
# server its trainer chose, which reshard cannot know for the new servers.
servers "$TMP/st" 1
mkdir -p "$TMP/st/save"
"$TRAINER" --ps "$PSS" --job st "${DATA[@]}" --max-steps 2 --checkpoint-every 2 --nlayers 2 \
    --stages ps0:1,local:1 --save "$TMP/st/save/lm" 2>"$TMP/st/r0.log" ||
    fail "--stages job: $(tail -3 "$TMP/st/r0.log")"
stop_servers st
expect_error "a job with layers on a server (--stages)" "so only row-sharded modules" "$CTL" \
    --into "$TMP/x0,$TMP/x1" reshard "$TMP/st/ck0/st-step2.ckpt"
expect_error "reshard without --into" "want --into" "$CTL" reshard "$TMP/ref/ck0/rs-step20.ckpt"
finish
