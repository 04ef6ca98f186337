#!/usr/bin/env bash
# What an operator sees: Prometheus /metrics and /healthz on ferry-ps and ferry-trainer
# (--metrics-listen, libmicrohttpd), scraped during a training run and parsed with the
# reference parser (python3-prometheus-client; promtool too when Debian's prometheus
# is installed), with counters that move as the run goes; ferry-ctl's health, stats,
# modules, checkpoint and shutdown; --version; JSON log lines.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
"$PY" -c "import prometheus_client" 2>/dev/null || { echo "SKIP: python3-prometheus-client not installed"; exit 77; }
CTL=$FERRY_BIN/server/ferry-ctl
scrape() { "$PY" "$FERRY_SRC/tests/integration/scrape.py" "$@"; }
http_port() { # LOG: the port of "metrics on http://HOST:PORT"
    for _ in $(seq 100); do
        p=$(grep -o "metrics on http://[^ ]*" "$1" 2>/dev/null | head -1 | sed 's/.*://')
        [ -n "$p" ] && { echo "$p"; return; }
        sleep 0.05
    done
    fail "no 'metrics on' line in $1: $(tail -3 "$1")"
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
"$PY" -c "
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    assert set(d) == {'ts', 'level', 'prog', 'msg'} and d['prog'] == 'ferry-ps', d
" "$TMP/obs.log" || fail "--log-format json: a line is not a JSON object: $(head -2 "$TMP/obs.log")"
ok "--log-format json: every ferry-ps log line is a JSON object ($(head -c 90 "$TMP/obs.log")...)"
[ "$("$PY" -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$MP/healthz').read().decode().strip())")" = ok ] ||
    fail "/healthz"
before=$(scrape "http://127.0.0.1:$MP/metrics") || fail "/metrics does not parse"
ok "ferry-ps /healthz ok; /metrics parses before training ($before)"

"$TRAINER" --ps "127.0.0.1:$PORT" --data "$FERRY_SRC/data/ptb" --train-tokens 20000 \
    --eval-tokens 400 --epochs 1 --emsize 32 --nhid 32 --bptt 10 --batch-size 4 \
    --max-steps 400 --log-interval 10 --progress off --metrics-out "$TMP/m.jsonl" \
    --metrics-listen 127.0.0.1:0 2>"$TMP/trainer.log" &
TPID=$!
TP=$(http_port "$TMP/trainer.log")
for _ in $(seq 500); do
    grep -q '"event":"train".*"step":20,' "$TMP/m.jsonl" 2>/dev/null && break
    sleep 0.02
done
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
sleep 0.3
f2=$(scrape "http://127.0.0.1:$MP/metrics" ferry_rpc_server_calls_total method=Forward code=OK)
wait "$TPID" || fail "trainer failed: $(tail -3 "$TMP/trainer.log")"
s3=$(scrape "http://127.0.0.1:$MP/metrics" ferry_ps_steps_applied_total)
early=$(scrape "http://127.0.0.1:$MP/metrics" ferry_ps_backward_early_replies_total)
"$PY" -c "import sys; a=[float(x) for x in sys.argv[1:]]; f1,f2,s1,s3,t1,lat,early=a; assert 0<f1<f2 and 0<s1<s3 and t1>=20 and lat>0 and early>=400, a" \
    "$f1" "$f2" "$s1" "$s3" "$t1" "$lat" "$early" || fail "counters did not move: Forward $f1 -> $f2, steps $s1 -> $s3, trainer step $t1, latency count $lat, early Backward replies $early"
ok "during training: Forward calls $f1 -> $f2, steps applied $s1 -> $s3; trainer at step $t1, $lat Forward latencies; $early decoder Backwards answered before their weight gradient"
if command -v promtool >/dev/null; then
    page "http://127.0.0.1:$MP/metrics" | promtool check metrics || fail "promtool check metrics"
    ok "promtool check metrics: ferry-ps's and ferry-trainer's pages are clean"
fi

# ferry-ctl
"$CTL" --ps "127.0.0.1:$PORT" health >"$TMP/ctl" || fail "ferry-ctl health: $(cat "$TMP/ctl")"
grep -q "127.0.0.1:$PORT SERVING" "$TMP/ctl" || fail "ferry-ctl health: $(cat "$TMP/ctl")"
"$CTL" --ps "127.0.0.1:$PORT" modules >"$TMP/ctl" || fail "ferry-ctl modules"
grep -q "^  decoder  *decoder  *\[10000 x 32\] rows 0\.\.10000 .* version [1-9]" "$TMP/ctl" || fail "ferry-ctl modules: $(cat "$TMP/ctl")"
"$CTL" --ps "127.0.0.1:$PORT" stats | grep -q "contexts_live" || fail "ferry-ctl stats"
"$CTL" --ps "127.0.0.1:$PORT" checkpoint ctl.ckpt >/dev/null || fail "ferry-ctl checkpoint"
[ -s "$TMP/ctl.ckpt" ] || fail "ferry-ctl checkpoint wrote nothing"
ok "ferry-ctl health, modules, stats, checkpoint ($(grep -c . "$TMP/ctl") lines of modules)"
expect_error "ferry-ctl with an unknown command" "want one of health" "$CTL" --ps 127.0.0.1:1 frobnicate
"$CTL" --ps "127.0.0.1:$PORT" shutdown >/dev/null || fail "ferry-ctl shutdown"
wait "$PS_PID" || fail "ferry-ps exited non-zero after ferry-ctl shutdown"
ok "ferry-ctl shutdown stopped ferry-ps (exit 0)"

# Errors a person can act on: four kinds of connection failure, the first three at once.
T=("$TRAINER" --data "$FERRY_SRC/data/ptb" --train-tokens 4000 --eval-tokens 400 --max-steps 1
    --progress off --connect-timeout 0)
t0=$(date +%s%N)
expect_error "a refused connection" "cannot connect to 127.0.0.1:1: connection refused" "${T[@]}" --ps 127.0.0.1:1
expect_error "an unresolvable host" "cannot resolve host 'nosuchhost.invalid'" "${T[@]}" --ps nosuchhost.invalid:7000
expect_error "a port out of range" "port '70000' is not a number in 1..65535" "${T[@]}" --ps localhost:70000
expect_error "no port" "server 'localhost': want HOST:PORT" "${T[@]}" --ps localhost
took=$((($(date +%s%N) - t0) / 1000000))
[ "$took" -lt 4000 ] || fail "the four refusals took $took ms, not 'at once'"
start_ps frozen
kill -STOP "$PS_PID"
expect_error "a server that accepts but does not answer" "did not answer in time" \
    "${T[@]}" --ps "127.0.0.1:$PORT" --deadline-ms 300
kill -CONT "$PS_PID"
rc=0
"${T[@]}" --ps 127.0.0.1:1 --connect-timeout 1 2>"$TMP/wait.log" || rc=$?
[ "$rc" -ne 0 ] && grep -q "waiting for the servers: cannot connect to 127.0.0.1:1" "$TMP/wait.log" ||
    fail "--connect-timeout: no waiting line: $(cat "$TMP/wait.log")"
ok "refused, unresolvable, malformed: one line each within $took ms together; a silent server: its own line; --connect-timeout says what it waits for"
kill "$PS_PID"
wait "$PS_PID" 2>/dev/null || true

# --drain-ms: after SIGTERM the health check says NOT_SERVING while calls are still
# served, then ferry-ps stops.
start_ps drain --drain-ms 1500
kill -TERM "$PS_PID"
sleep 0.3
h=$("$CTL" --ps "127.0.0.1:$PORT" health) && fail "ferry-ctl health during the drain: exit 0 ($h)"
[ "$h" = "127.0.0.1:$PORT NOT_SERVING" ] || fail "during the drain: '$h'"
wait "$PS_PID" || fail "ferry-ps exited non-zero after the drain"
ok "--drain-ms 1500: SIGTERM, then health NOT_SERVING while calls are served, then exit 0"
start_ps holder
expect_error "a port in use" "cannot listen on 127.0.0.1:$PORT: the port is in use" "$PS" --listen "127.0.0.1:$PORT"
expect_error "a --listen port out of range" "port '99999' is not a number in 0..65535" "$PS" --listen localhost:99999
kill "$PS_PID"
wait "$PS_PID" 2>/dev/null || true
finish
