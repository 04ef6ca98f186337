#!/usr/bin/env bash
# What a person at the command line meets: one exit-code convention (2 bad command
# line, 1 failed run) stated in every --help; "did you mean" for a mistyped flag;
# --help numbers and defaults printed cleanly; the last line of a failure in JSON
# with --log-format json or FERRY_LOG_FORMAT=json, in every binary; the progress
# line and evaluation of a --max-steps run; an unknown host refused at once; --load
# finding the corpus by itself; the whole model's parameter count; a clear word from
# scripts/plot_metrics.py without matplotlib.
. "$(dirname "$0")/lib.sh"
CTL=$FERRY_BIN/server/ferry-ctl
PY=/usr/bin/python3
D=$FERRY_SRC/data/ptb

# exit_code WANT WHAT CMD...: the command exits WANT (and is not killed).
exit_code() {
    local want=$1 what=$2 rc=0
    shift 2
    "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" -eq "$want" ] || fail "$what: exit $rc, want $want: $(tail -2 "$TMP/err")"
    grep -q "Sanitizer\|runtime error" "$TMP/err" && fail "$what: sanitizer report: $(cat "$TMP/err")"
    return 0
}

# ---- --help ------------------------------------------------------------------------
for b in "$PS" "$TRAINER" "$CTL"; do
    name=$(basename "$b")
    exit_code 0 "$name --help" "$b" --help
    h=$TMP/out
    grep -q "^exit status: 0 done.*; 1 .*; 2 bad command line" "$h" || fail "$name --help states no exit status"
    grep -q "^  FERRY_LOG_FORMAT " "$h" || fail "$name --help does not list FERRY_LOG_FORMAT"
    grep "(default.*(default" "$h" && fail "$name --help doubles a default"
    grep -E "[0-9]\.[0-9]*(9999|0000)[0-9]|[0-9]e\+0[0-9]\b" "$h" && fail "$name --help prints a number badly"
    grep -q "default false" "$h" && fail "$name --help prints '(default false)' for a switch"
done
"$TRAINER" --help >"$TMP/th"
grep -q -- "--dropout NUM .*(default 0, range \[0, 0.99\])" "$TMP/th" ||
    fail "ferry-trainer --help: --dropout's range: $(grep -- --dropout "$TMP/th")"
grep -q -- "--world INT .* (default FERRY_WORLD, SLURM_NTASKS, or 1, range \[1, 65536\])" "$TMP/th" ||
    fail "ferry-trainer --help: --world's default: $(grep -- --world "$TMP/th")"
"$PS" --help >"$TMP/ph"
grep -q -- "--blas-threads INT .*(default 1, or OPENBLAS_NUM_THREADS, range \[1, 64\])" "$TMP/ph" ||
    fail "ferry-ps --help: --blas-threads: $(grep -- --blas-threads "$TMP/ph")"
ok "--help of ferry-ps, ferry-trainer, ferry-ctl: exit status stated, FERRY_LOG_FORMAT listed, one default each, numbers as written (0.99)"

# ---- exit codes ------------------------------------------------------------------------
start_ps cli
exit_code 2 "ferry-ps, unknown flag" "$PS" --bogus
exit_code 2 "ferry-ps, bad --listen" "$PS" --listen localhost:99999
exit_code 1 "ferry-ps, port in use" "$PS" --listen "127.0.0.1:$PORT"
exit_code 2 "ferry-trainer, unknown flag" "$TRAINER" --bogus
exit_code 2 "ferry-trainer, bad value" "$TRAINER" --dropout 1.5
exit_code 2 "ferry-trainer, flags that exclude each other" "$TRAINER" --local --ps "127.0.0.1:$PORT"
exit_code 2 "ferry-trainer, a bad --job name" "$TRAINER" --ps "127.0.0.1:$PORT" --job 'a b' --sync bsp
grep -q "job 'a b': 1..48 characters" "$TMP/err" || fail "--job: $(cat "$TMP/err")"
exit_code 2 "ferry-trainer, --stages on a server --ps does not name" \
    "$TRAINER" --ps "127.0.0.1:$PORT" --stages ps1:2
grep -q "ps1, but --ps names 1 server" "$TMP/err" || fail "--stages: $(cat "$TMP/err")"
exit_code 2 "ferry-trainer, --sync that is no mode" "$TRAINER" --ps "127.0.0.1:$PORT" --sync sometimes
exit_code 2 "ferry-trainer, --micro-batches above --bptt" \
    "$TRAINER" --ps "127.0.0.1:$PORT" --micro-batches 8 --bptt 4
exit_code 1 "ferry-trainer, a missing corpus" "$TRAINER" --data "$TMP/nothing" --max-steps 1
exit_code 1 "ferry-trainer, nothing listens" \
    "$TRAINER" --ps 127.0.0.1:1 --connect-timeout 0 --data "$D" --train-tokens 4000 --eval-tokens 400
exit_code 2 "ferry-ctl, unknown flag" "$CTL" --ps "127.0.0.1:$PORT" --bogus x health
exit_code 2 "ferry-ctl, unknown command" "$CTL" --ps "127.0.0.1:$PORT" frobnicate
exit_code 2 "ferry-ctl, no --ps" "$CTL" health
exit_code 1 "ferry-ctl, nothing listens" "$CTL" --ps 127.0.0.1:1 stats
ok "exit codes: 2 for every bad command line (also --job, --stages, --sync, --micro-batches, found before running), 1 for every failed run, in all three binaries"

# ---- did you mean ------------------------------------------------------------------------
exit_code 2 "a mistyped trainer flag" "$TRAINER" --max-step 30
grep -qx "ferry-trainer: unknown flag --max-step (did you mean --max-steps?)" "$TMP/err" ||
    fail "--max-step: $(cat "$TMP/err")"
exit_code 2 "a mistyped ferry-ps flag" "$PS" --listn 127.0.0.1:0
grep -q "unknown flag --listn (did you mean --listen?)" "$TMP/err" || fail "--listn: $(cat "$TMP/err")"
exit_code 2 "a mistyped ferry-ctl flag" "$CTL" --ps "127.0.0.1:$PORT" --tokenfile x stats
grep -q "unknown flag --tokenfile (did you mean --token-file?)" "$TMP/err" || fail "--tokenfile: $(cat "$TMP/err")"
exit_code 2 "a single dash" "$TRAINER" -lr 1
grep -q "unknown flag -lr (did you mean --lr?)" "$TMP/err" || fail "-lr: $(cat "$TMP/err")"
ok "did you mean: --max-step -> --max-steps, --listn -> --listen, --tokenfile -> --token-file, -lr -> --lr"

# ---- the last line in JSON ------------------------------------------------------------------
# json_last WHAT CMD...: fails (exit 1 or 2), every stderr line is a JSON object of the
# log schema, and the last one is the error.
json_last() {
    local what=$1 rc=0
    shift
    "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" -eq 1 ] || [ "$rc" -eq 2 ] || fail "$what: exit $rc"
    "$PY" - "$TMP/err" <<'EOF' || fail "$what: not JSON lines: $(cat "$TMP/err")"
import json, sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
assert lines, "no output"
for l in lines:
    d = json.loads(l)
    assert set(d) == {"ts", "level", "prog", "msg"}, d
last = json.loads(lines[-1])
assert last["level"] == "error" and last["prog"].startswith("ferry-") and last["msg"], last
EOF
    ok "$what: $(tail -1 "$TMP/err" | cut -c1-130)"
}
json_last "ferry-ps --log-format json, bad flag" "$PS" --log-format json --bogus
json_last "ferry-ps FERRY_LOG_FORMAT=json, port in use" env FERRY_LOG_FORMAT=json "$PS" --listen "127.0.0.1:$PORT"
json_last "ferry-trainer --log-format=json, bad flag before it" "$TRAINER" --max-step 3 --log-format=json
json_last "ferry-trainer FERRY_LOG_FORMAT=json, failed run" \
    env FERRY_LOG_FORMAT=json "$TRAINER" --data "$TMP/nothing" --max-steps 1
json_last "ferry-trainer --log-format json, server unreachable" "$TRAINER" --log-format json \
    --ps 127.0.0.1:1 --connect-timeout 0 --data "$D" --train-tokens 4000 --eval-tokens 400
json_last "ferry-ctl --log-format json, server unreachable" "$CTL" --log-format json --ps 127.0.0.1:1 health
json_last "ferry-ctl FERRY_LOG_FORMAT=json, bad command" env FERRY_LOG_FORMAT=json "$CTL" --ps 127.0.0.1:1 frobnicate

# ---- an unknown host, at once -------------------------------------------------------------
if "$PY" -c "import socket, sys
try: socket.getaddrinfo('nosuchhost.invalid', 7000)
except socket.gaierror as e: sys.exit(0 if e.errno == socket.EAI_NONAME else 1)
sys.exit(1)"; then
    t0=$(date +%s%N)
    exit_code 1 "an unknown host" "$TRAINER" --ps nosuchhost.invalid:7000 --data "$D" \
        --train-tokens 4000 --eval-tokens 400 --max-steps 1
    took=$((($(date +%s%N) - t0) / 1000000))
    grep -q "cannot resolve host 'nosuchhost.invalid'.*\[--resolve-timeout" "$TMP/err" ||
        fail "unknown host: $(cat "$TMP/err")"
    # At once: not retried until the 30 s connect timeout (no wall-clock limit: load
    # only makes a run slower; a wait would say "still, after waiting").
    grep -q "waiting for the servers\|still, after waiting" "$TMP/err" &&
        fail "an unknown host was waited for: $(cat "$TMP/err")"
    ok "an unknown host fails in $took ms with the default --connect-timeout 30 (--resolve-timeout waits)"
else
    echo "skipped: this resolver does not say 'no such name' for nosuchhost.invalid"
fi

# ---- --max-steps: progress, evaluation, parameters -----------------------------------------
SMALL=(--data "$D" --train-tokens 40000 --eval-tokens 4000 --emsize 16 --nhid 16 --bptt 10
    --batch-size 4)
"$TRAINER" --local "${SMALL[@]}" --max-steps 30 --log-interval 10 --progress plain \
    2>"$TMP/plain.log" || fail "trainer: $(tail -3 "$TMP/plain.log")"
for s in 10 20 30; do
    grep -q "epoch 1 step $s/30 |" "$TMP/plain.log" || fail "no 'step $s/30': $(cat "$TMP/plain.log")"
done
grep -q "step 30/30 .*| eta 0:00:00$" "$TMP/plain.log" || fail "the ETA at the last step: $(grep 'step 30/' "$TMP/plain.log")"
grep -q "step [0-9]*/1000 " "$TMP/plain.log" && fail "the progress counts the whole epoch"
# 4000 tokens / 10 columns / bptt 10: 40 windows, of which 10 are evaluated.
grep -q "epoch 1 valid: .*on the first 10 of 40 windows: --max-steps ended the epoch early" "$TMP/plain.log" ||
    fail "the valid evaluation of a short run: $(grep valid "$TMP/plain.log")"
grep -q "epoch 1 test: .*on the first 10 of 40 windows" "$TMP/plain.log" || fail "the test evaluation of a short run"
layer0=$((4 * 16 * (16 + 16) + 8 * 16)) # 4H(in + H) + 8H, in = E = H = 16
grep -q "model: V=10000 E=16 H=16 L=2, $((10000 * 16 * 2 + 10000 + 2 * layer0)) parameters;" "$TMP/plain.log" ||
    fail "the local parameter count: $(grep model: "$TMP/plain.log")"
FERRY_PROGRESS=tty "$TRAINER" --local "${SMALL[@]}" --max-steps 30 --eval-batches 0 \
    2>"$TMP/tty.log" || fail "trainer (tty): $(tail -3 "$TMP/tty.log")"
tr '\r' '\n' <"$TMP/tty.log" >"$TMP/tty.lines"
grep -q "^epoch 1 \[=*\] 30/30 | .*eta 0:00:00" "$TMP/tty.lines" ||
    fail "the bar does not end full at 30/30: $(grep 30/ "$TMP/tty.lines" | tail -1)"
grep -q "epoch 1 valid: loss [0-9.]* ppl [0-9.]* ([0-9.]* s)$" "$TMP/tty.log" ||
    fail "--eval-batches 0: $(grep valid "$TMP/tty.log")"
ok "--max-steps 30: progress 10/30, 20/30, 30/30 (bar full, ETA 0), valid and test on 10 of 40 windows (--eval-batches 0: all)"

# A staged model: every part counted, and the trainer's share named.
"$TRAINER" --ps "127.0.0.1:$PORT" --stages ps0:2,local:2 --nlayers 4 "${SMALL[@]}" --max-steps 2 \
    --progress off 2>"$TMP/staged.log" || fail "staged trainer: $(tail -3 "$TMP/staged.log")"
want=$((10000 * 16 * 2 + 10000 + 4 * layer0)) here=$((2 * layer0))
grep -q "model: V=10000 E=16 H=16 L=4, $want parameters, $here ([0-9]*%) in this trainer and the rest on the servers;" \
    "$TMP/staged.log" || fail "staged parameter count: $(grep model: "$TMP/staged.log")"
ok "a 4-layer model staged over ferry-ps and the trainer: $want parameters, $here in the trainer"
stop_clean "$PS_PID" "ferry-ps" "$TMP/cli.log"

# ---- --load finds the corpus ---------------------------------------------------------------
mkdir -p "$TMP/run/corpus" "$TMP/elsewhere"
head -c 30000 "$D/train.txt" >"$TMP/run/corpus/train.txt"
head -c 5000 "$D/valid.txt" >"$TMP/run/corpus/valid.txt"
cp "$TMP/run/corpus/valid.txt" "$TMP/run/corpus/test.txt"
(cd "$TMP/run" && "$TRAINER" --data corpus --emsize 16 --nhid 16 --bptt 10 --batch-size 4 \
    --max-steps 5 --save "$TMP/run/lm.ck" --progress off 2>"$TMP/save.log") ||
    fail "save: $(tail -3 "$TMP/save.log")"
(cd "$TMP/elsewhere" && "$TRAINER" --load "$TMP/run/lm.ck" --max-steps 8 --progress off \
    2>"$TMP/load.log") || fail "--load without --data from another directory: $(tail -3 "$TMP/load.log")"
grep -q "corpus $TMP/run/corpus: vocabulary" "$TMP/load.log" || fail "the corpus: $(grep corpus "$TMP/load.log")"
grep -q "resumed from $TMP/run/lm.ck.5: epoch 1 at window 5, step 5" "$TMP/load.log" ||
    fail "resume: $(grep resumed "$TMP/load.log")"
ok "--load restores --data (recorded as an absolute path): resumed from another directory"

# ---- scripts/plot_metrics.py --------------------------------------------------------------
"$TRAINER" --local "${SMALL[@]}" --max-steps 20 --log-interval 5 --progress off \
    --metrics-out "$TMP/m.jsonl" 2>/dev/null || fail "metrics run"
rc=0
"$PY" -c "import sys; sys.modules['matplotlib'] = None; sys.argv = sys.argv[1:]
exec(compile(open(sys.argv[0]).read(), sys.argv[0], 'exec'))" \
    "$FERRY_SRC/scripts/plot_metrics.py" "$TMP/m.jsonl" -o "$TMP/m.png" 2>"$TMP/plot.err" || rc=$?
[ "$rc" -eq 1 ] || fail "plot_metrics.py without matplotlib: exit $rc: $(cat "$TMP/plot.err")"
grep -q "^plot_metrics.py: needs matplotlib.*apt-get install python3-matplotlib" "$TMP/plot.err" ||
    fail "plot_metrics.py without matplotlib: $(cat "$TMP/plot.err")"
grep -q "Traceback" "$TMP/plot.err" && fail "plot_metrics.py without matplotlib: a traceback"
if "$PY" -c "import matplotlib" 2>/dev/null; then
    "$FERRY_SRC/scripts/plot_metrics.py" "$TMP/m.jsonl" -o "$TMP/m.png" 2>"$TMP/plot.err" ||
        fail "plot_metrics.py: $(cat "$TMP/plot.err")"
    [ "$(head -c 8 "$TMP/m.png" | od -An -c | tr -d ' ')" = '211PNG\r\n032\n' ] || fail "plot_metrics.py wrote no PNG"
    ok "plot_metrics.py: one line naming python3-matplotlib without it; a PNG with it"
else
    ok "plot_metrics.py: one line naming python3-matplotlib without it (python3-matplotlib not installed: no plot)"
fi
finish
