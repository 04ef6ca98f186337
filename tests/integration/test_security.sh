#!/usr/bin/env bash
# ferry-ps on a network: identities (a token table with roles, or the client
# certificate's subject), sessions, ownership of modules, contexts and job ranks, the
# standard health service, and the refusal to serve a network address unprotected. A
# trainer trains through mutual TLS with its token; an unmodified gRPC client
# (python3-grpcio, stubs generated from proto/*.proto alone) drives ferry.v1 (Hello
# with a session, a step, a job of two ranks) and is refused with the right status for
# each wrong credential; then a 2-rank job runs while another identity and a second
# session of the job's own identity try every known way in (impersonation, gradient
# injection, recover, takeover, squatting, replayed replies): each is refused, and the
# job's losses equal an undisturbed run's bit for bit.
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
# A certificate the CA signed, with neither a CN nor a subject alternative name.
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$C/nocn.key" 2>/dev/null
openssl req -new -key "$C/nocn.key" -subj "/O=ferry test" -out "$TMP/nocn.csr" 2>/dev/null
printf 'extendedKeyUsage=clientAuth\n' >"$TMP/nocn.ext"
openssl x509 -req -in "$TMP/nocn.csr" -CA "$C/ca.pem" -CAkey "$C/ca.key" -CAcreateserial -days 1 \
    -extfile "$TMP/nocn.ext" -out "$C/nocn.pem" 2>/dev/null

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

# Under mutual TLS the identity is the certificate's subject; the token gives the role.
got=$(FERRY_T_TOKEN=$(cat "$TMP/trainer.tok") client hello)
[ "$got" = "ferry-trainer trainer contract 1.8" ] || fail "hello over mutual TLS: $got"
ok "Hello over mutual TLS: identity from the certificate's CN, role from the token ($got)"

# A standard client drives the model with the trainer token.
FERRY_T_TOKEN=$(cat "$TMP/trainer.tok") client drive >"$TMP/drive" || fail "grpcio drive: $(cat "$TMP/drive")"
ok "python grpcio (stubs from proto/ferry.proto): Hello with a session, CreateModule, Forward, Backward, Step, GetParams ($(cut -c1-70 "$TMP/drive")...)"
FERRY_T_TOKEN=$(cat "$TMP/trainer.tok") client job >"$TMP/job" || fail "grpcio job: $(cat "$TMP/job")"
ok "python grpcio: $(cat "$TMP/job")"

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
check "a certificate without a CN or SAN" "UNAUTHENTICATED: Hello: the client certificate names no subject" \
    "$(FERRY_T_CERT=$C/nocn.pem FERRY_T_KEY=$C/nocn.key FERRY_T_TOKEN=$(cat "$TMP/trainer.tok") client call Hello)"
grep -q "refused: Shutdown needs role admin" "$TMP/sec.log" || fail "the refusal is not logged"

# The admin token may stop the server.
[ "$(FERRY_T_TOKEN=$(cat "$TMP/admin.tok") client call Shutdown)" = OK ] || fail "admin Shutdown refused"
for _ in $(seq 100); do kill -0 "$PS_PID" 2>/dev/null || break; sleep 0.05; done
kill -0 "$PS_PID" 2>/dev/null && fail "ferry-ps still running after the admin's Shutdown"
wait "$PS_PID" || fail "ferry-ps exited non-zero after Shutdown"
ok "the admin token's Shutdown stopped ferry-ps (exit 0)"

# ---- identities from a token table: roles, sessions, ownership -----------------------
for who in alice mallory viewer; do openssl rand -hex 24 >"$TMP/$who.tok"; done
{
    echo "# name role token"
    echo "alice trainer $(cat "$TMP/alice.tok")"
    echo "mallory trainer $(cat "$TMP/mallory.tok")"
    echo "viewer reader $(cat "$TMP/viewer.tok")"
} >"$TMP/tokens"
start_ps ids --token-file "$TMP/tokens" --admin-token-file "$TMP/admin.tok" --shutdown-grace-ms 500
export FERRY_T_CA=
for who in alice mallory viewer admin; do
    got=$(FERRY_T_TOKEN=$(cat "$TMP/$who.tok") client hello)
    case $who in viewer) role=reader ;; admin) role=admin ;; *) role=trainer ;; esac
    [ "$got" = "$who $role contract 1.8" ] || fail "hello as $who: $got"
done
ok "a token table: each token is its identity with its role (alice, mallory trainers; viewer reader; admin)"
check "a reader calling SetParams" "PERMISSION_DENIED: SetParams needs role admin" \
    "$(FERRY_T_TOKEN=$(cat "$TMP/viewer.tok") client call SetParams)"
check "a reader calling Stats" OK "$(FERRY_T_TOKEN=$(cat "$TMP/viewer.tok") client call Stats)"
got=$(FERRY_T_TOKEN=$(cat "$TMP/alice.tok") FERRY_T_TOKEN2=$(cat "$TMP/mallory.tok") \
    FERRY_T_ADMIN=$(cat "$TMP/admin.tok") client sessions)
want="a2-step NOT_FOUND; a2-release found=0; b-forward NOT_FOUND; b-getparams NOT_FOUND; b-create ALREADY_EXISTS"
want="$want; a2-join-rank0 ALREADY_EXISTS; a2-leave-rank0 PERMISSION_DENIED; b-join PERMISSION_DENIED"
want="$want; b-status PERMISSION_DENIED; admin-getparams OK; admin-status OK; a1-step OK"
want="$want; b-with-a1-session UNAUTHENTICATED"
[ "$got" = "$want" ] || fail "two sessions of one identity, another identity, an admin:
 got  $got
 want $want"
ok "two sessions of one identity and a second identity cannot touch each other's contexts, modules or ranks; an admin can; a session id is useless with other credentials"
kill "$PS_PID"
wait "$PS_PID" || fail "ferry-ps (identities) exited non-zero"

# ---- a 2-rank job under attack finishes as an undisturbed one ----------------------
JOB=(--job lm --world 2 --data "$FERRY_SRC/data/ptb" --train-tokens 40000 --eval-tokens 400
    --epochs 1 --emsize 32 --nhid 32 --bptt 10 --batch-size 8 --max-steps 300 --log-interval 1
    --progress off --token-file "$TMP/alice.tok" --sync-timeout 30)
run_job() { # NAME: both ranks against $PORT, their metrics in $TMP/NAME.r{0,1}.jsonl
    local r pids=()
    for r in 0 1; do
        "$TRAINER" --ps "127.0.0.1:$PORT" "${JOB[@]}" --rank $r --metrics-out "$TMP/$1.r$r.jsonl" \
            2>"$TMP/$1.r$r.log" &
        pids+=($!)
    done
    RANKS=("${pids[@]}")
}
start_ps ref --token-file "$TMP/tokens" --shutdown-grace-ms 500
run_job ref
for r in 0 1; do wait "${RANKS[$r]}" || fail "reference rank $r: $(tail -3 "$TMP/ref.r$r.log")"; done
kill "$PS_PID"
wait "$PS_PID" || fail "ferry-ps (reference) exited non-zero"
start_ps attacked --token-file "$TMP/tokens" --shutdown-grace-ms 500
run_job att
FERRY_T_TOKEN=$(cat "$TMP/mallory.tok") FERRY_T_STOLEN=$(cat "$TMP/alice.tok") client attack lm \
    >"$TMP/attack" 2>"$TMP/attack.err" || fail "attack client: $(cat "$TMP/attack.err")"
running=0
for r in 0 1; do kill -0 "${RANKS[$r]}" 2>/dev/null && running=$((running + 1)); done
for r in 0 1; do wait "${RANKS[$r]}" || fail "rank $r under attack: $(tail -3 "$TMP/att.r$r.log")"; done
[ "$running" -ge 1 ] || fail "the job finished before the attack did (make it longer)"
expect_attack() { # WHAT CODE
    grep -qx "$1 $2" "$TMP/attack" || fail "attack '$1': want $2, got '$(grep "^$1 " "$TMP/attack")'"
}
expect_attack other-join PERMISSION_DENIED
expect_attack other-squat-world-65536 PERMISSION_DENIED
expect_attack other-leave PERMISSION_DENIED
expect_attack other-recover PERMISSION_DENIED
expect_attack other-probe PERMISSION_DENIED
expect_attack other-checkpoint PERMISSION_DENIED
expect_attack other-gradnorm PERMISSION_DENIED
expect_attack other-step PERMISSION_DENIED
expect_attack other-fetch PERMISSION_DENIED
expect_attack other-install PERMISSION_DENIED
expect_attack other-reshard-begin PERMISSION_DENIED
expect_attack other-reshard-export PERMISSION_DENIED
expect_attack other-reshard-adopt PERMISSION_DENIED
expect_attack other-setparams PERMISSION_DENIED
expect_attack stolen-join-rank0 ALREADY_EXISTS
expect_attack stolen-leave-rank1 PERMISSION_DENIED
expect_attack stolen-ready PERMISSION_DENIED
expect_attack stolen-recover ALREADY_EXISTS
expect_attack stolen-fetch-rank1 PERMISSION_DENIED
expect_attack stolen-gradnorm-rank1 PERMISSION_DENIED
expect_attack stolen-step-rank1 PERMISSION_DENIED
expect_attack stolen-release-found 0
expect_attack stolen-step-replay NOT_FOUND
expect_attack other-with-stolen-session UNAUTHENTICATED
expect_attack refusals-name-nobody yes
[ "$(grep -c . "$TMP/attack")" -eq 25 ] || fail "attack: $(cat "$TMP/attack")"
for r in 0 1; do
    a=$(train_losses "$TMP/ref.r$r.jsonl")
    [ "$(echo "$a" | grep -c .)" -eq 300 ] || fail "reference rank $r logged $(echo "$a" | grep -c .) losses"
    cmp <(echo "$a") <(train_losses "$TMP/att.r$r.jsonl") >/dev/null ||
        fail "rank $r's losses under attack differ from the undisturbed run"
done
ok "21 attacks on a running job (another identity; a second session with the job's own token) refused, no refusal naming a holder, and the job's 2 x 300 losses equal the undisturbed run's bit for bit"
kill "$PS_PID"
wait "$PS_PID" || fail "ferry-ps (attacked) exited non-zero"

# Health/Watch: a stream that stays open, says NOT_SERVING when the server drains, ends.
start_ps watch --drain-ms 1500
export FERRY_T_CA=
client watch >"$TMP/watch" &
WPID=$!
for _ in $(seq 100); do grep -q SERVING "$TMP/watch" 2>/dev/null && break; sleep 0.05; done
sleep 0.3
kill -TERM "$PS_PID"
wait "$WPID" || fail "the Watch client exited $?: $(cat "$TMP/watch")"
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
stop_clean "$PS_PID" "ferry-ps (checkpoint rate)" "$TMP/rate.log"
finish
