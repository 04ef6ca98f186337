#!/usr/bin/env bash
# ferry-ps on a network: mutual TLS and bearer tokens with two roles, context
# ownership, the standard health service, and the refusal to serve a network address
# unprotected. A trainer trains through TLS with its token; then an unmodified gRPC
# client (python3-grpcio, stubs generated from proto/*.proto alone) is refused with
# the right status for each wrong credential, and the server keeps serving.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
"$PY" -c "import grpc, grpc_tools" 2>/dev/null || { echo "SKIP: python3-grpcio / python3-grpc-tools not installed"; exit 77; }
command -v openssl >/dev/null || { echo "SKIP: openssl not installed"; exit 77; }
bash "$FERRY_SRC/scripts/make-test-certs.sh" "$TMP/certs" 2>/dev/null
C=$TMP/certs
"$PY" -m grpc_tools.protoc -I"$FERRY_SRC/proto" --python_out="$TMP" --grpc_python_out="$TMP" \
    "$FERRY_SRC/proto/ferry.proto" "$FERRY_SRC/proto/health.proto"
client() { "$PY" "$FERRY_SRC/tests/integration/grpc_client.py" "$TMP" "127.0.0.1:$PORT" "$@"; }
umask 077
openssl rand -hex 24 >"$TMP/trainer.tok"
openssl rand -hex 24 >"$TMP/admin.tok"
openssl rand -hex 24 >"$TMP/wrong.tok"

# Unprotected on a network address: refused, naming the way out.
expect_error "ferry-ps on 0.0.0.0 without TLS or a token" "refusing to serve 0.0.0.0:0 without TLS and a token" \
    "$PS" --listen 0.0.0.0:0
expect_error "mismatched TLS flags" "--tls-cert and --tls-key go together" \
    "$PS" --listen 127.0.0.1:0 --tls-cert "$C/server.pem"
expect_error "a token file that is too short" "use 16 to 4096" \
    env FERRY_TOKEN_FILE=<(echo short) "$PS" --listen 127.0.0.1:0

# Mutual TLS + both tokens (the trainer token from the environment, as compose would).
FERRY_TOKEN_FILE=$TMP/trainer.tok start_ps sec --tls-cert "$C/server.pem" --tls-key "$C/server.key" \
    --tls-ca "$C/ca.pem" --admin-token-file "$TMP/admin.tok" --checkpoint-dir "$TMP"
export FERRY_T_CA=$C/ca.pem FERRY_T_CERT=$C/client.pem FERRY_T_KEY=$C/client.key

# Training works through TLS with the trainer token.
"$TRAINER" --ps "127.0.0.1:$PORT" --tls-ca "$C/ca.pem" --tls-cert "$C/client.pem" \
    --tls-key "$C/client.key" --token-file "$TMP/trainer.tok" --data "$FERRY_SRC/data/ptb" \
    --train-tokens 4000 --eval-tokens 400 --epochs 1 --emsize 32 --nhid 32 --bptt 10 \
    --batch-size 4 --max-steps 20 --log-interval 5 --progress off --metrics-out "$TMP/m.jsonl" \
    2>"$TMP/trainer.log" || fail "training over TLS with a token: $(tail -3 "$TMP/trainer.log")"
n=$(train_losses "$TMP/m.jsonl" | wc -l)
[ "$n" -ge 4 ] || fail "training over TLS: $n train events"
ok "ferry-trainer trained 20 steps against ferry-ps over mutual TLS with the trainer token"

# Health needs no token (but the TLS handshake).
[ "$(client health)" = SERVING ] || fail "health: $(client health)"
ok "grpc.health.v1.Health/Check without a token: SERVING"

# A standard client drives the model with the trainer token.
FERRY_T_TOKEN=$(cat "$TMP/trainer.tok") client drive >"$TMP/drive" || fail "grpcio drive: $(cat "$TMP/drive")"
ok "python grpcio (stubs from proto/ferry.proto): Hello, CreateModule, Forward, Backward, Step, GetParams ($(cut -c1-60 "$TMP/drive")...)"

# Refusals, each with its status; the server keeps serving after each.
check() { # WHAT WANT OUTPUT
    case $3 in "$2"*) ;; *) fail "$1: got '$3', want $2" ;; esac
    [ "$(client health)" = SERVING ] || fail "$1: the server stopped serving"
    ok "$1: $(echo "$3" | cut -c1-110)"
}
check "no token" UNAUTHENTICATED "$(client call Hello)"
check "a wrong token" UNAUTHENTICATED "$(FERRY_T_TOKEN=$(cat "$TMP/wrong.tok") client call Stats)"
check "the trainer token calling Shutdown" PERMISSION_DENIED "$(FERRY_T_TOKEN=$(cat "$TMP/trainer.tok") client call Shutdown)"
check "the trainer token calling Checkpoint" PERMISSION_DENIED "$(FERRY_T_TOKEN=$(cat "$TMP/trainer.tok") client call Checkpoint)"
check "the admin token calling Checkpoint" OK "$(FERRY_T_TOKEN=$(cat "$TMP/admin.tok") client call Checkpoint)"
check "plaintext against the TLS port" UNAVAILABLE "$(FERRY_T_CA= FERRY_T_TOKEN=$(cat "$TMP/trainer.tok") client call Hello)"
check "a client certificate from another CA" UNAVAILABLE \
    "$(FERRY_T_CERT=$C/other-client.pem FERRY_T_KEY=$C/other-client.key FERRY_T_TOKEN=$(cat "$TMP/trainer.tok") client call Hello)"
check "no client certificate (mutual TLS)" UNAVAILABLE \
    "$(FERRY_T_CERT= FERRY_T_KEY= FERRY_T_TOKEN=$(cat "$TMP/trainer.tok") client call Hello)"
got=$(FERRY_T_TOKEN=$(cat "$TMP/trainer.tok") client steal)
[ "$got" = "Step PERMISSION_DENIED; ReleaseContext PERMISSION_DENIED; owner Step OK" ] ||
    fail "another worker's context: $got"
ok "another worker stepping or releasing a context: PERMISSION_DENIED; its owner steps it"
grep -q "refused: Shutdown needs the admin token" "$TMP/sec.log" || fail "the refusal is not logged"

# The admin token may stop the server.
[ "$(FERRY_T_TOKEN=$(cat "$TMP/admin.tok") client call Shutdown)" = OK ] || fail "admin Shutdown refused"
for _ in $(seq 100); do kill -0 "$PS_PID" 2>/dev/null || break; sleep 0.05; done
kill -0 "$PS_PID" 2>/dev/null && fail "ferry-ps still running after the admin's Shutdown"
wait "$PS_PID" || fail "ferry-ps exited non-zero after Shutdown"
ok "the admin token's Shutdown stopped ferry-ps (exit 0)"

# Health/Watch: a stream that stays open, says NOT_SERVING when the server drains, ends.
start_ps watch --drain-ms 1500
export FERRY_T_CA=
client watch >"$TMP/watch" &
WPID=$!
for _ in $(seq 100); do grep -q SERVING "$TMP/watch" 2>/dev/null && break; sleep 0.05; done
sleep 0.3
kill -TERM "$PS_PID"
wait "$WPID"
wait "$PS_PID" || fail "ferry-ps exited non-zero after draining"
[ "$(tr '\n' ' ' <"$TMP/watch")" = "SERVING NOT_SERVING END OK " ] || fail "Watch: $(cat "$TMP/watch")"
ok "grpc.health.v1.Health/Watch: SERVING, stays open, NOT_SERVING on SIGTERM (--drain-ms), then ends OK"

# Checkpoints are rate-limited (a token bucket, --checkpoint-rate per minute).
start_ps rate --admin-token-file "$TMP/admin.tok" --checkpoint-dir "$TMP" --checkpoint-rate 2
export FERRY_T_CA= FERRY_T_TOKEN=$(cat "$TMP/admin.tok")
r=$(client call Checkpoint; client call Checkpoint; client call Checkpoint)
[ "$(echo "$r" | head -2 | tr '\n' ' ')" = "OK OK " ] || fail "checkpoint rate: $r"
echo "$r" | tail -1 | grep -q "^ABORTED: Checkpoint refused: more than 2 per minute" ||
    fail "the third checkpoint within a minute: $(echo "$r" | tail -1)"
ok "--checkpoint-rate 2: the third Checkpoint within a minute is refused ($(echo "$r" | tail -1 | cut -c1-70)...)"
kill "$PS_PID"
wait "$PS_PID" 2>/dev/null || true
finish
