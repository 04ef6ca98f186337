# lib.sh - helpers for the shell-driven integration tests: temp dirs, checks, and
# the paths ctest passes (FERRY_BIN = build dir, FERRY_SRC = source dir). Every
# process a test starts has its exit status checked (stop_clean, reap_killed, or a
# wait of its own), every wait for a state fails with a message when it times out
# (wait_until), and finish fails the test if any text file under $TMP holds a
# sanitizer report (no_sanitizer_reports), so a daemon that aborted or leaked under
# ASan at shutdown is never missed.
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
    # A failed test's first sanitizer report (a daemon's log holds it, and the log goes
    # with $TMP): shown, so that a CI log says what a daemon that aborted found.
    if [ "${failed_:-0}" = 1 ]; then
        local f
        f=$(grep -rIlE "$SANITIZER_RE" "$TMP" 2>/dev/null | head -1) || true
        if [ -n "$f" ]; then
            echo "---- the first sanitizer report under the test's files: ${f#"$TMP"/} ----" >&2
            grep -m1 -n -E "$SANITIZER_RE" "$f" | cut -d: -f1 |
                { read -r at && tail -n "+$((at > 3 ? at - 3 : 1))" "$f" | head -60; } >&2 || true
        fi
    fi
    # FERRY_KEEP_FAILED=DIR: a failed test's files (logs, checkpoints) are kept there.
    if [ -n "${FERRY_KEEP_FAILED:-}" ] && [ "${failed_:-0}" = 1 ]; then
        rm -rf "$FERRY_KEEP_FAILED" && cp -a "$TMP" "$FERRY_KEEP_FAILED" &&
            echo "files of the failed test kept in $FERRY_KEEP_FAILED" >&2
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

fail() {
    echo "FAIL: $*" >&2
    failed_=1
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

# ps_port_written_: start_ps's state to wait for (its name and PS_PID): the port file
# is there, or the process exited (the test fails).
ps_port_written_() {
    [ -s "$TMP/$name.port" ] && return 0
    kill -0 "$PS_PID" 2>/dev/null || fail "ferry-ps exited: $(cat "$TMP/$name.log")"
    return 1
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
    WAIT_LOG=$TMP/$name.log wait_until "ferry-ps $name's port file" 60 ps_port_written_
    PORT=$(cat "$TMP/$name.port")
}

# The step of the last train event in a metrics file ("" before the first).
last_step() { grep '"event":"train"' "$1" 2>/dev/null | tail -1 | sed 's/.*"step":\([0-9]*\),.*/\1/'; }

# at_least FILE PID N: a state for wait_until: FILE (a trainer's metrics) logged step N
# or a later one; the test fails at once if PID, the trainer writing it, has exited.
at_least() {
    local s
    s=$(last_step "$1")
    [ -n "$s" ] && [ "$s" -ge "$3" ] && return 0
    kill -0 "$2" 2>/dev/null || fail "the trainer writing $1 exited before step $3"
    return 1
}

# Losses of the train events in a metrics file, one per line.
train_losses() {
    grep '"event":"train"' "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/'
}

# Lines that AddressSanitizer, LeakSanitizer, UndefinedBehaviorSanitizer and
# ThreadSanitizer write when they find something.
SANITIZER_RE='ERROR: (Address|Leak|Memory)Sanitizer|WARNING: ThreadSanitizer|runtime error:|SUMMARY: [A-Za-z]+Sanitizer'

# no_sanitizer_reports [DIR|FILE...]: fails naming the first text file (under $TMP by
# default) that holds a sanitizer report. Run it on a directory before removing it.
no_sanitizer_reports() {
    local f
    f=$(grep -rIlE "$SANITIZER_RE" "${@:-$TMP}" 2>/dev/null | head -1) || true
    [ -z "$f" ] || fail "sanitizer report in $f: $(grep -m3 -E "$SANITIZER_RE" "$f")"
}

# stop_clean PID WHAT [LOG]: SIGTERM, then the process must exit 0 (LOG's tail is
# shown if it does not).
stop_clean() {
    kill -TERM "$1" 2>/dev/null || true # it may have exited already: wait says how
    local rc=0
    wait "$1" || rc=$?
    [ "$rc" -eq 0 ] || fail "$2 exited $rc on SIGTERM${3:+: $(tail -3 "$3" 2>/dev/null)}"
}

# reap_killed PID WHAT: a process this test sent SIGKILL must have died of it (137),
# not exited by itself before.
reap_killed() {
    local rc=0
    wait "$1" || rc=$?
    [ "$rc" -eq 137 ] || fail "$2: exit status $rc, want 137 (killed by SIGKILL)"
}

# wait_until WHAT SECONDS CMD...: runs CMD every 0.05 s until it succeeds; fails
# naming WHAT (and showing the tail of $WAIT_LOG, if set) when SECONDS pass first.
# SECONDS is a bound against a hang, not a claim about speed: make it generous
# (ASan, two cores, ctest -j).
wait_until() {
    local what=$1 secs=$2
    shift 2
    local end=$((SECONDS + secs))
    until "$@"; do
        [ "$SECONDS" -lt "$end" ] ||
            fail "timed out after $secs s waiting for $what${WAIT_LOG:+: $(tail -3 "$WAIT_LOG" 2>/dev/null)}"
        sleep 0.05
    done
}

# logged FILE PATTERN PID: a state for wait_until: FILE has a line matching PATTERN
# (grep); the test fails at once if PID, the process writing FILE, has exited.
logged() {
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null ||
        fail "the process writing $1 exited before logging '$2': $(tail -3 "$1" 2>/dev/null)"
    return 1
}

# same_listing WHAT A B [N]: two listings (text) must be equal and not empty, with
# exactly N lines when N is given.
same_listing() {
    local what=$1 a=$2 b=$3 n=${4:-}
    [ -n "$a" ] || fail "$what: the listing is empty"
    [ -z "$n" ] || [ "$(printf '%s\n' "$a" | wc -l)" -eq "$n" ] ||
        fail "$what: $(printf '%s\n' "$a" | wc -l) lines, want $n"
    [ "$a" = "$b" ] || fail "$what: the listings differ: $(diff <(echo "$a") <(echo "$b") | head -6)"
}

# same_state A B WHAT: two checkpoint files (ferry-trainer parts, or ferry-ps files)
# hold the same state bit for bit: every section but CONF and MANI (the
# configuration and the manifest, which name paths and ports) equal byte for byte,
# split out by tests/tools/ferry_ck_sections after it verified both files.
same_state() {
    local a=$1 b=$2 what=$3 d f
    d=$(mktemp -d "$TMP/sections.XXXXXX")
    mkdir "$d/a" "$d/b"
    "$FERRY_BIN/tests/ferry_ck_sections" "$a" "$d/a" || fail "$what: cannot read $a"
    "$FERRY_BIN/tests/ferry_ck_sections" "$b" "$d/b" || fail "$what: cannot read $b"
    [ "$(ls "$d/a")" = "$(ls "$d/b")" ] ||
        fail "$what: other sections: $(ls "$d/a" | tr '\n' ' ') against $(ls "$d/b" | tr '\n' ' ')"
    for f in "$d/a"/*; do
        case $f in *-CONF | *-MANI) continue ;; esac
        cmp -s "$f" "$d/b/${f##*/}" || fail "$what: section ${f##*/} differs ($a, $b)"
    done
    rm -rf "$d"
}

finish() {
    no_sanitizer_reports
    echo "$passed passed, 0 failed"
}
