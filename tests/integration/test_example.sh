#!/usr/bin/env bash
# examples/classic_lm end to end: a ferry-ps on 127.0.0.1 (port 0, --port-file) hosts
# the example's embedding and decoder; 60 steps on its synthetic data must take the
# loss from about ln 64 = 4.16 to well below it; then SIGTERM must stop ferry-ps
# cleanly (exit 0).
. "$(dirname "$0")/lib.sh"
EXAMPLE=$FERRY_BIN/examples/classic_lm
[ -x "$EXAMPLE" ] || fail "no $EXAMPLE: build the classic_lm target"

start_ps ps --log-level warn
ok "ferry-ps listening on 127.0.0.1:$PORT"

"$EXAMPLE" "127.0.0.1:$PORT" 60 >"$TMP/out" 2>"$TMP/err" ||
    fail "classic_lm exited $?: $(tail -3 "$TMP/err")"
n=$(grep -c '^step .* loss ' "$TMP/out" || true)
[ "$n" -eq 60 ] || fail "expected 60 loss lines, got $n: $(head -3 "$TMP/out")"
first=$(awk '/^step/ { print $4; exit }' "$TMP/out")
last=$(awk '/^step/ { v = $4 } END { print v }' "$TMP/out")
awk -v f="$first" 'BEGIN { exit !(f > 3.9 && f < 4.4) }' ||
    fail "first loss $first is not about ln 64 = 4.16"
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < 1.5 && l < f / 3) }' ||
    fail "loss did not fall: first $first, last $last"
ok "classic_lm trained: loss $first -> $last in 60 steps"

# A second run finds the modules on the server and continues training from them.
"$EXAMPLE" "127.0.0.1:$PORT" 3 >"$TMP/out2" 2>"$TMP/err2" ||
    fail "second classic_lm run exited $?: $(tail -3 "$TMP/err2")"
again=$(awk '/^step/ { print $4; exit }' "$TMP/out2")
awk -v a="$again" -v f="$first" 'BEGIN { exit !(a < f - 0.5) }' ||
    fail "second run starts at loss $again: the server's modules were not reused"
ok "a second run reuses the trained remote modules (loss $again)"

# A server that is not there: one clear error line, no crash.
expect_error "classic_lm against a closed port" "classic_lm: connect" \
    "$EXAMPLE" "127.0.0.1:1" 1
expect_error "classic_lm without arguments" "usage: classic_lm" "$EXAMPLE"

kill -TERM "$PS_PID"
rc=0
wait "$PS_PID" || rc=$?
[ "$rc" -eq 0 ] || fail "ferry-ps exited $rc after SIGTERM: $(tail -3 "$TMP/ps.log")"
ok "ferry-ps exited 0 after SIGTERM"
finish
