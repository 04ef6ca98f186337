#!/usr/bin/env bash
# TLS set up on one side only, or a certificate the other side refuses, is reported as
# such at once: ferry-trainer (whose --connect-timeout of 30 s retries what may come
# back) and ferry-ctl each fail without retrying (no "waiting for the servers" line,
# no "still, after waiting" in the error; no wall-clock limit: load only makes a run
# slower) with one line that says TLS, what is wrong and what to do, never gRPC's bare
# "Socket closed". ferry-ctl health
# needs no token on a server with tokens (the standard health check, no Hello).
. "$(dirname "$0")/lib.sh"
command -v openssl >/dev/null || { echo "SKIP: openssl not installed"; exit 77; }
bash "$FERRY_SRC/scripts/make-test-certs.sh" "$TMP/certs" 2>/dev/null
C=$TMP/certs
CTL=$FERRY_BIN/server/ferry-ctl
umask 077
openssl rand -hex 24 >"$TMP/trainer.tok"
openssl rand -hex 24 >"$TMP/admin.tok"
# A small corpus: the trainer reaches its connect within a fraction of a second.
mkdir -p "$TMP/tiny"
head -c 20000 "$FERRY_SRC/data/ptb/train.txt" >"$TMP/tiny/train.txt"
head -c 4000 "$FERRY_SRC/data/ptb/valid.txt" >"$TMP/tiny/valid.txt"
cp "$TMP/tiny/valid.txt" "$TMP/tiny/test.txt"
T=("$TRAINER" --data "$TMP/tiny" --emsize 16 --nhid 16 --max-steps 1 --progress off)
# at_once WHAT PHRASE CMD...: one error line containing PHRASE (and "TLS"), exit 1,
# and no retry: the connect gave up at its first answer (the time it took is shown).
at_once() {
    local what=$1 phrase=$2
    shift 2
    local t0 rc=0
    t0=$(date +%s%N)
    "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    local took=$((($(date +%s%N) - t0) / 1000000))
    [ "$rc" -eq 1 ] || fail "$what: exit $rc, want 1: $(cat "$TMP/err")"
    grep -v '^[0-9T:.-]*Z [IW] ' "$TMP/err" >"$TMP/err1" || true
    [ "$(grep -c . "$TMP/err1")" -eq 1 ] || fail "$what: want one error line: $(cat "$TMP/err")"
    grep -qF -- "$phrase" "$TMP/err1" || fail "$what: lacks '$phrase': $(cat "$TMP/err1")"
    grep -q "TLS" "$TMP/err1" || fail "$what: does not say TLS: $(cat "$TMP/err1")"
    grep -q "Socket closed" "$TMP/err1" && fail "$what: gRPC's bare words: $(cat "$TMP/err1")"
    grep -q "waiting for the servers" "$TMP/err" && fail "$what: retried: $(cat "$TMP/err")"
    grep -q "still, after waiting" "$TMP/err1" && fail "$what: waited out the timeout: $(cat "$TMP/err1")"
    ok "$what: $took ms: $(cut -c1-150 "$TMP/err1")"
}

# Mutual TLS with both tokens, and a plaintext server beside it.
start_ps tls --tls-cert "$C/server.pem" --tls-key "$C/server.key" --tls-ca "$C/ca.pem" \
    --token-file "$TMP/trainer.tok" --admin-token-file "$TMP/admin.tok"
TLS_PORT=$PORT TLS_PID=$PS_PID
start_ps plain
PLAIN_PORT=$PORT
MTLS=(--tls-ca "$C/ca.pem" --tls-cert "$C/client.pem" --tls-key "$C/client.key")

at_once "plaintext trainer, TLS ferry-ps" "the server speaks TLS and this client connected without it" \
    "${T[@]}" --ps "127.0.0.1:$TLS_PORT" --token-file "$TMP/trainer.tok"
grep -q -- "--tls-ca" "$TMP/err1" || fail "the trainer's line names no flag: $(cat "$TMP/err1")"
at_once "TLS trainer, plaintext ferry-ps" "this client connected with TLS and the server does not speak it" \
    "${T[@]}" --ps "127.0.0.1:$PLAIN_PORT" "${MTLS[@]}"
at_once "a client certificate from another CA" "refused the one this client sent" \
    "${T[@]}" --ps "127.0.0.1:$TLS_PORT" --tls-ca "$C/ca.pem" --tls-cert "$C/other-client.pem" \
    --tls-key "$C/other-client.key" --token-file "$TMP/trainer.tok"
at_once "no client certificate (mutual TLS)" "this client sent none" \
    "${T[@]}" --ps "127.0.0.1:$TLS_PORT" --tls-ca "$C/ca.pem" --token-file "$TMP/trainer.tok"
at_once "a server certificate from another CA" "this client refused the server's certificate (certificate verify failed)" \
    "${T[@]}" --ps "127.0.0.1:$TLS_PORT" --tls-ca "$C/other-ca.pem" --tls-cert "$C/client.pem" \
    --tls-key "$C/client.key" --token-file "$TMP/trainer.tok"
at_once "ferry-ctl in plaintext against TLS" "the server speaks TLS" \
    "$CTL" --ps "127.0.0.1:$TLS_PORT" --token-file "$TMP/admin.tok" stats
at_once "ferry-ctl health in plaintext against TLS" "the server speaks TLS" \
    "$CTL" --ps "127.0.0.1:$TLS_PORT" health
at_once "ferry-ctl health with TLS against plaintext" "the server does not speak it" \
    "$CTL" --ps "127.0.0.1:$PLAIN_PORT" --tls-ca "$C/ca.pem" health
# Both servers keep serving; the TLS one logged the refused handshakes as information.
grep -q "I ferry-ps: grpc: a TLS handshake failed" "$TMP/tls.log" ||
    fail "ferry-ps did not log the failed handshakes: $(tail -3 "$TMP/tls.log")"
grep -q " W ferry-ps: grpc: .*andshake" "$TMP/tls.log" && fail "handshake failures logged as warnings"

# The right credentials work; health needs no token (a token server, no --token-file).
out=$("$CTL" --ps "127.0.0.1:$TLS_PORT" "${MTLS[@]}" health) || fail "ferry-ctl health without a token: $out"
[ "$out" = "127.0.0.1:$TLS_PORT SERVING" ] || fail "ferry-ctl health: '$out'"
env -u FERRY_TOKEN_FILE "$CTL" --ps "127.0.0.1:$TLS_PORT" "${MTLS[@]}" stats >"$TMP/out" 2>"$TMP/err" &&
    fail "ferry-ctl stats without a token succeeded"
grep -q UNAUTHENTICATED "$TMP/err" || fail "stats without a token: $(cat "$TMP/err")"
ok "ferry-ctl health without a token on a server with tokens: SERVING (stats without one: UNAUTHENTICATED)"
"${T[@]}" --ps "127.0.0.1:$TLS_PORT" "${MTLS[@]}" --token-file "$TMP/trainer.tok" 2>"$TMP/t.log" ||
    fail "a trainer with the right certificates and token: $(tail -3 "$TMP/t.log")"
ok "with the right certificates and token the trainer trains"
stop_clean "$TLS_PID" "ferry-ps (TLS)" "$TMP/tls.log"
stop_clean "$PS_PID" "ferry-ps (plain)" "$TMP/plain.log"
finish
