#!/usr/bin/env bash
# run.sh TEST.sh: how ctest runs an integration test. The test's output goes to a file;
# when the test fails, its FAIL line (and a sanitizer's report line) comes first, then
# the whole output in order, so a log that keeps only the start of a failing test's
# output still says why it failed. The test gets FERRY_RUN_LIMIT seconds (ctest's
# TIMEOUT less a margin, so the output is printed before ctest would kill this);
# the exit status is the test's (124, or 137 after the grace, when it ran out of time).
out=$(mktemp "${TMPDIR:-/tmp}/ferry-run.XXXXXX") || exit 1
timeout -k 10 "${FERRY_RUN_LIMIT:-3600}" bash "$1" >"$out" 2>&1
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] &&
        echo "FAIL: $(basename "$1") exited $rc: ran past ${FERRY_RUN_LIMIT:-3600} s, or killed"
    grep -m 3 -e '^FAIL' -e 'ERROR: AddressSanitizer' -e 'ERROR: LeakSanitizer' \
        -e 'runtime error:' "$out"
    echo "---- the whole output of $(basename "$1") (exit $rc) ----"
fi
cat "$out"
rm -f "$out"
exit "$rc"
