#!/usr/bin/env bash
# tests/support/check.h itself: CHECK_EQ takes integers, enums and pointers and
# refuses a floating-point operand at compile time (either side, an expression too);
# CHECK_BITS_EQ takes two floats or two doubles, refuses a mix or an integer, and
# aborts, naming both values, when the bits differ (0.0f against -0.0f). Compiled
# with the C compiler on the PATH (cc, or $CC), as C11 with the project's warnings.
. "$(dirname "$0")/lib.sh"
CC=${CC:-cc}
command -v "$CC" >/dev/null || fail "no C compiler '$CC'"
cat >"$TMP/t.c" <<'C'
#include "check.h"
enum kind { KIND_A, KIND_B };
int main(void) {
    int i = 1;
    long long ll = 1;
    const char *p = "x";
    enum kind k = KIND_B;
    float f = 0.25f;
    double d = 0.25;
    CHECK_EQ(i, ll);
    CHECK_EQ(p, p);
    CHECK_EQ(k, KIND_B);
    CHECK_EQ(sizeof i, 4);
    CHECK_BITS_EQ(f, 0.25f);
    CHECK_BITS_EQ(d, 0.25);
    CASE
    return 0;
}
C
build() { # build CASE-TEXT: compiles t.c with CASE replaced; output in $TMP/cc.log
    "$CC" -std=c11 -Wall -Wextra -Wpedantic -Wdouble-promotion -Werror \
        -I"$FERRY_SRC/include" -I"$FERRY_SRC/tests/support" -I"$FERRY_SRC" \
        "-DCASE=$1" "$TMP/t.c" -o "$TMP/t" >"$TMP/cc.log" 2>&1
}
build "" || fail "integers, enums, pointers and same-type floats do not compile: $(cat "$TMP/cc.log")"
"$TMP/t" 2>"$TMP/run.log" || fail "equal values failed a check: $(cat "$TMP/run.log")"
ok "CHECK_EQ on integers, enums and pointers, CHECK_BITS_EQ on floats and on doubles"

refused() { # refused CASE-TEXT MESSAGE
    build "$1" && fail "'$1' compiled"
    grep -q "$2" "$TMP/cc.log" || fail "'$1' was refused, but not by check.h: $(head -5 "$TMP/cc.log")"
    ok "refused at compile time: $1"
}
refused "CHECK_EQ(f, 0);" "CHECK_EQ on a floating-point operand"
refused "CHECK_EQ(0, d);" "CHECK_EQ on a floating-point operand"
refused "CHECK_EQ(i, i * 0.5);" "CHECK_EQ on a floating-point operand"
refused "CHECK_BITS_EQ(f, 0.25);" "CHECK_BITS_EQ compares two floats or two doubles"
refused "CHECK_BITS_EQ(i, 1);" "CHECK_BITS_EQ compares two floats or two doubles"

build "CHECK_BITS_EQ(0.0f, -0.0f);" || fail "CHECK_BITS_EQ(0.0f, -0.0f) does not compile: $(cat "$TMP/cc.log")"
rc=0
"$TMP/t" 2>"$TMP/run.log" || rc=$?
[ "$rc" -eq 134 ] || fail "CHECK_BITS_EQ(0.0f, -0.0f) exited $rc, want an abort (134)"
grep -qF -- "CHECK_BITS_EQ(0.0f, -0.0f) failed: 0x0p+0 != -0x0p+0" "$TMP/run.log" ||
    fail "CHECK_BITS_EQ(0.0f, -0.0f): $(cat "$TMP/run.log")"
ok "CHECK_BITS_EQ(0.0f, -0.0f) aborts: $(cat "$TMP/run.log")"
finish
