#!/usr/bin/env bash
# What an operator sees: Prometheus /metrics and /healthz on ferry-ps and ferry-trainer
# (--metrics-listen, libmicrohttpd), scraped during a training run and parsed with the
# reference parser (python3-prometheus-client; promtool too when Debian's prometheus
# is installed), with counters that move as the run goes (a trainer that runs until
# it is stopped, scraped at one step and again 20 steps later); ferry-ctl's health,
# stats, modules, checkpoint and shutdown; --version; every line of ferry-ps's JSON
# log (start-up, training, shutdown) a JSON object. Every process's exit status is
# checked.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
"$PY" -c "import prometheus_client" 2>/dev/null || { echo "SKIP: python3-prometheus-client not installed"; exit 77; }
CTL=$FERRY_BIN/server/ferry-ctl
scrape() { "$PY" "$FERRY_SRC/tests/integration/scrape.py" "$@"; }
http_port() { # LOG: the port of "metrics on http://HOST:PORT"
    WAIT_LOG=$1 wait_until "a 'metrics on' line in $1" 60 grep -q "metrics on http://" "$1"
    grep -o "metrics on http://[^ ]*" "$1" | head -1 | sed 's/.*://; s/"$//'
}

for b in "$PS" "$TRAINER" "$CTL"; do
    v=$("$b" --version) || fail "$(basename "$b") --version failed"
    [[ $v =~ ^ferry-(ps|trainer|ctl)\ [0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "--version printed '$v'"
done
ok "--version on ferry-ps, ferry-trainer and ferry-ctl ($("$PS" --version))"
# Whole help texts first (grep -q would close the pipe early: SIGPIPE under pipefail).
"$PS" --help >"$TMP/ps-help.txt" || fail "ferry-ps --help exited $?"
"$TRAINER" --help >"$TMP/trainer-help.txt" || fail "ferry-trainer --help exited $?"
grep -q "FERRY_ADMIN_TOKEN_FILE" "$TMP/ps-help.txt" || fail "ferry-ps --help lists no environment"
grep -q "^  SLURM_NTASKS, SLURM_PROCID" "$TMP/trainer-help.txt" ||
    fail "ferry-trainer --help lists no environment"
ok "--help lists the environment variables each binary reads"

start_ps obs --metrics-listen 127.0.0.1:0 --checkpoint-dir "$TMP" --log-format json
MP=$(http_port "$TMP/obs.log")
[ "$("$PY" -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$MP/healthz').read().decode().strip())")" = ok ] ||
    fail "/healthz"
before=$(scrape "http://127.0.0.1:$MP/metrics") || fail "/metrics does not parse"
ok "ferry-ps /healthz ok; /metrics parses before training ($before)"

# The trainer has no step limit and 1000 epochs: it is still training whenever the
# test looks, until the SIGTERM below.
"$TRAINER" --ps "127.0.0.1:$PORT" --data "$FERRY_SRC/data/ptb" --train-tokens 20000 \
    --eval-tokens 400 --epochs 1000 --emsize 32 --nhid 32 --bptt 10 --batch-size 4 \
    --log-interval 10 --progress off --metrics-out "$TMP/m.jsonl" \
    --metrics-listen 127.0.0.1:0 2>"$TMP/trainer.log" &
TPID=$!
TP=$(http_port "$TMP/trainer.log")
trainer_at() { # trainer_at STEP: the trainer has logged STEP or a later step
    local s
    s=$({ grep '"event":"train"' "$TMP/m.jsonl" 2>/dev/null || true; } | tail -1 |
        sed 's/.*"step":\([0-9]*\),.*/\1/')
    [ "${s:-0}" -ge "$1" ] && return 0
    kill -0 "$TPID" 2>/dev/null || fail "the trainer exited: $(tail -3 "$TMP/trainer.log")"
    return 1
}
WAIT_LOG=$TMP/trainer.log wait_until "the trainer to log step 20" 300 trainer_at 20
f1=$(scrape "http://127.0.0.1:$MP/metrics" ferry_rpc_server_calls_total method=Forward code=OK) ||
    fail "no Forward calls counted"
s1=$(scrape "http://127.0.0.1:$MP/metrics" ferry_ps_steps_applied_total)
t1=$(scrape "http://127.0.0.1:$TP/metrics" ferry_trainer_step) || fail "trainer /metrics"
lat=$(scrape "http://127.0.0.1:$TP/metrics" ferry_trainer_call_latency_seconds_count method=Forward)
scrape "http://127.0.0.1:$TP/metrics" >/dev/null || fail "trainer /metrics does not parse"
page() { "$PY" -c "import urllib.request, sys; print(urllib.request.urlopen(sys.argv[1]).read().decode(), end='')" "$1"; }
if command -v promtool >/dev/null; then
    page "http://127.0.0.1:$TP/metrics" >"$TMP/trainer.prom"
    promtool check metrics <"$TMP/trainer.prom" || fail "promtool check metrics (trainer)"
fi
# 20 steps later (a state, not a time): the counters moved.
WAIT_LOG=$TMP/trainer.log wait_until "the trainer to log step $((${t1%.*} + 20))" 300 \
    trainer_at $((${t1%.*} + 20))
f2=$(scrape "http://127.0.0.1:$MP/metrics" ferry_rpc_server_calls_total method=Forward code=OK)
t2=$(scrape "http://127.0.0.1:$TP/metrics" ferry_trainer_step) || fail "trainer /metrics"
stop_clean "$TPID" "ferry-trainer" "$TMP/trainer.log"
last=$(grep -o 'stopping on signal after step [0-9]*' "$TMP/trainer.log" | grep -o '[0-9]*$') ||
    fail "the trainer did not log its stop: $(tail -3 "$TMP/trainer.log")"
s3=$(scrape "http://127.0.0.1:$MP/metrics" ferry_ps_steps_applied_total)
early=$(scrape "http://127.0.0.1:$MP/metrics" ferry_ps_backward_early_replies_total)
# Every step's decoder Backward is answered before its weight gradient is formed.
"$PY" -c "import sys; a=[float(x) for x in sys.argv[1:]]; f1,f2,s1,s3,t1,t2,lat,early,last=a; assert 0<f1<f2 and 0<s1<s3 and 20<=t1<t2 and lat>0 and s3>=last and early>=last, a" \
    "$f1" "$f2" "$s1" "$s3" "$t1" "$t2" "$lat" "$early" "$last" || fail "counters did not move: Forward $f1 -> $f2, steps $s1 -> $s3, trainer step $t1 -> $t2, latency count $lat, early Backward replies $early after $last steps"
ok "during training: Forward calls $f1 -> $f2, steps applied $s1 -> $s3; trainer at step $t1 -> $t2, $lat Forward latencies; $early decoder Backwards of $last steps answered before their weight gradient; the trainer exited 0 on SIGTERM"
if command -v promtool >/dev/null; then
    page "http://127.0.0.1:$MP/metrics" | promtool check metrics || fail "promtool check metrics"
    ok "promtool check metrics: ferry-ps's and ferry-trainer's pages are clean"
fi

# ferry-ctl
"$CTL" --ps "127.0.0.1:$PORT" health >"$TMP/ctl" || fail "ferry-ctl health: $(cat "$TMP/ctl")"
grep -q "127.0.0.1:$PORT SERVING" "$TMP/ctl" || fail "ferry-ctl health: $(cat "$TMP/ctl")"
"$CTL" --ps "127.0.0.1:$PORT" modules >"$TMP/ctl" || fail "ferry-ctl modules"
grep -q "^  decoder  *decoder  *\[10000 x 32\] rows 0\.\.10000 .* version [1-9]" "$TMP/ctl" || fail "ferry-ctl modules: $(cat "$TMP/ctl")"
"$CTL" --ps "127.0.0.1:$PORT" stats >"$TMP/ctl-stats" || fail "ferry-ctl stats exited $?"
grep -q "contexts_live" "$TMP/ctl-stats" || fail "ferry-ctl stats: $(head -3 "$TMP/ctl-stats")"
"$CTL" --ps "127.0.0.1:$PORT" checkpoint ctl.ckpt >/dev/null || fail "ferry-ctl checkpoint"
[ -s "$TMP/ctl.ckpt" ] || fail "ferry-ctl checkpoint wrote nothing"
ok "ferry-ctl health, modules, stats, checkpoint ($(grep -c . "$TMP/ctl") lines of modules)"
expect_error "ferry-ctl with an unknown command" "want one of health" "$CTL" --ps 127.0.0.1:1 frobnicate
"$CTL" --ps "127.0.0.1:$PORT" shutdown >/dev/null || fail "ferry-ctl shutdown"
wait "$PS_PID" || fail "ferry-ps exited non-zero after ferry-ctl shutdown"
ok "ferry-ctl shutdown stopped ferry-ps (exit 0)"
# The whole log, start-up to shutdown (the training's lines between), one JSON object
# a line.
"$PY" -c "
import json, sys
n = 0
for line in open(sys.argv[1]):
    d = json.loads(line)
    assert set(d) == {'ts', 'level', 'prog', 'msg'} and d['prog'] == 'ferry-ps', d
    n += 1
assert n >= 3, n
" "$TMP/obs.log" || fail "--log-format json: a line is not a JSON object: $(head -2 "$TMP/obs.log")"
grep -q '"msg":"metrics on http' "$TMP/obs.log" && grep -q '"msg":"stopped after' "$TMP/obs.log" ||
    fail "--log-format json: the log lacks its start-up or shutdown line: $(cat "$TMP/obs.log")"
ok "--log-format json: all $(grep -c . "$TMP/obs.log") ferry-ps log lines, start-up to shutdown, are JSON objects"

# Errors a person can act on: four kinds of connection failure, the first three at once.
T=("$TRAINER" --data "$FERRY_SRC/data/ptb" --train-tokens 4000 --eval-tokens 400 --max-steps 1
    --progress off --connect-timeout 0)
expect_error "a refused connection" "cannot connect to 127.0.0.1:1: connection refused" "${T[@]}" --ps 127.0.0.1:1
expect_error "an unresolvable host" "cannot resolve host 'nosuchhost.invalid'" "${T[@]}" --ps nosuchhost.invalid:7000
expect_error "a port out of range" "port '70000' is not a number in 1..65535" "${T[@]}" --ps localhost:70000
expect_error "no port" "server 'localhost': want HOST:PORT" "${T[@]}" --ps localhost
start_ps frozen
kill -STOP "$PS_PID"
expect_error "a server that accepts but does not answer" "did not answer in time" \
    "${T[@]}" --ps "127.0.0.1:$PORT" --deadline-ms 300
kill -CONT "$PS_PID"
stop_clean "$PS_PID" "the frozen ferry-ps, let go" "$TMP/frozen.log"
rc=0
"${T[@]}" --ps 127.0.0.1:1 --connect-timeout 1 2>"$TMP/wait.log" || rc=$?
[ "$rc" -ne 0 ] && grep -q "waiting for the servers: cannot connect to 127.0.0.1:1" "$TMP/wait.log" ||
    fail "--connect-timeout: no waiting line: $(cat "$TMP/wait.log")"
ok "refused, unresolvable, malformed: one line each, at once (--connect-timeout 0: no waiting line); a silent server: its own line; --connect-timeout says what it waits for"

# --drain-ms: after SIGTERM the health check says NOT_SERVING while calls are still
# served, then ferry-ps stops. The check waits for the drain's log line; the drain
# lasts 5 s from there.
start_ps drain --drain-ms 5000
kill -TERM "$PS_PID"
WAIT_LOG=$TMP/drain.log wait_until "ferry-ps to start draining" 60 grep -q "draining:" "$TMP/drain.log"
h=$("$CTL" --ps "127.0.0.1:$PORT" health) && fail "ferry-ctl health during the drain: exit 0 ($h)"
[ "$h" = "127.0.0.1:$PORT NOT_SERVING" ] || fail "during the drain: '$h'"
wait "$PS_PID" || fail "ferry-ps exited non-zero after the drain"
ok "--drain-ms 5000: SIGTERM, then health NOT_SERVING while calls are served, then exit 0"
start_ps holder
expect_error "a port in use" "cannot listen on 127.0.0.1:$PORT: the port is in use" "$PS" --listen "127.0.0.1:$PORT"
expect_error "a --listen port out of range" "port '99999' is not a number in 0..65535" "$PS" --listen localhost:99999
stop_clean "$PS_PID" "ferry-ps holding the port" "$TMP/holder.log"
finish
