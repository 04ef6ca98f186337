# lib.sh - helpers for the shell-driven integration tests: temp dirs, checks, and
# the paths ctest passes (FERRY_BIN = build dir, FERRY_SRC = source dir).
set -euo pipefail
: "${FERRY_BIN:?run through ctest}" "${FERRY_SRC:?run through ctest}"
TRAINER=$FERRY_BIN/worker/ferry-trainer
PS=$FERRY_BIN/server/ferry-ps
TMP=$(mktemp -d /tmp/ferry-it.XXXXXX)
export FERRY_PROGRESS=plain
passed=0

cleanup() {
    local pids
    pids=$(jobs -p || true)
    [ -n "$pids" ] && kill $pids 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

ok() {
    passed=$((passed + 1))
    echo "ok - $*"
}

# expect_error "what" "phrase" cmd...: the command must exit non-zero, print exactly
# one line on stderr containing phrase, and not crash.
expect_error() {
    local what=$1 phrase=$2
    shift 2
    local rc=0
    "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" -ne 0 ] || fail "$what: exit 0"
    [ "$rc" -lt 128 ] || fail "$what: killed by signal $((rc - 128))"
    grep -q "Sanitizer\|runtime error" "$TMP/err" && fail "$what: sanitizer report: $(cat "$TMP/err")"
    grep -qF -- "$phrase" "$TMP/err" || fail "$what: stderr lacks '$phrase': $(cat "$TMP/err")"
    # Progress and info log lines ("... I ferry-trainer: ...") may precede the error.
    grep -v '^[0-9T:.-]*Z I ' "$TMP/err" >"$TMP/err1" || true
    [ "$(grep -c . "$TMP/err1")" -eq 1 ] || fail "$what: expected one error line, got: $(cat "$TMP/err")"
    ok "$what ($(cat "$TMP/err1"))"
}

# start_ps NAME [FLAG...]: a ferry-ps ($PS_BIN, default $PS) on 127.0.0.1 with an
# ephemeral port, read from its port file; sets PS_PID and PORT. Its stderr goes to
# $TMP/NAME.log.
start_ps() {
    local name=$1
    shift
    rm -f "$TMP/$name.port"
    "${PS_BIN:-$PS}" --listen 127.0.0.1:0 --port-file "$TMP/$name.port" "$@" 2>"$TMP/$name.log" &
    PS_PID=$!
    for _ in $(seq 200); do
        [ -s "$TMP/$name.port" ] && break
        kill -0 "$PS_PID" 2>/dev/null || fail "ferry-ps exited: $(cat "$TMP/$name.log")"
        sleep 0.05
    done
    PORT=$(cat "$TMP/$name.port" 2>/dev/null) ||
        fail "ferry-ps wrote no port file within 10 s: $(cat "$TMP/$name.log")"
}

# Losses of the train events in a metrics file, one per line.
train_losses() {
    grep '"event":"train"' "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/'
}

finish() {
    echo "$passed passed, 0 failed"
}
