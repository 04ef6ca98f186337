#!/usr/bin/env bash
# libferry as an outside program sees it: `cmake --install` into a temporary prefix,
# then examples/ (classic_lm and first_client, the README's "Your first client") built
# from a separate directory, once with nothing but `pkg-config --cflags --libs ferry`
# and once with CMake's find_package(ferry); every binary must train against the
# installed ferry-ps, and neither they nor libferry may need a CUDA library; libferry
# exports exactly what its headers declare. Every installed public header must compile on its own
# (C11, and C++ when a C++ compiler is present).
. "$(dirname "$0")/lib.sh"
if [ -n "${FERRY_SANITIZE:-}" ]; then
    # An ASan-built libferry needs the sanitizer runtime preloaded into every
    # program; the release stage of scripts/test.sh runs this test.
    echo "skipped: sanitizer build (${FERRY_SANITIZE}); the release build runs it"
    exit 77
fi
PREFIX=$TMP/prefix
cmake --install "$FERRY_BIN" --prefix "$PREFIX" >"$TMP/install.log" ||
    fail "cmake --install: $(tail -3 "$TMP/install.log")"
so=$(find "$PREFIX" -name 'libferry.so' -print -quit)
[ -n "$so" ] || fail "no libferry.so under $PREFIX"
LIBDIR=$(dirname "$so")
for f in "$LIBDIR/libferry.a" "$LIBDIR/pkgconfig/ferry.pc" "$LIBDIR/cmake/ferry/ferryConfig.cmake" \
    "$PREFIX/include/ferry/ferry.h" "$PREFIX/bin/ferry-ps" "$PREFIX/bin/ferry-trainer" \
    "$PREFIX/bin/ferry-ctl"; do
    [ -e "$f" ] || fail "not installed: $f"
done
soname=$(objdump -p "$LIBDIR/libferry.so" | awk '/SONAME/ { print $2 }')
case "$soname" in libferry.so.*) ;; *) fail "libferry.so has no versioned soname ($soname)" ;; esac
[ -e "$LIBDIR/$soname" ] || fail "the soname link $soname is not installed"
ok "installed: $soname, libferry.a, ferry.pc, CMake package, headers, ferry-ps, ferry-trainer, ferry-ctl"

# The library boundary: the installed libferry.so's dynamic symbols are exactly the
# functions and variables include/ferry/ declares (FERRY_API), no private helper and
# no generated protobuf-c code among them.
exports=$(python3 "$FERRY_SRC/scripts/check-exports.py" --lib "$LIBDIR/$soname" 2>&1) ||
    fail "libferry's exports: $(echo "$exports" | head -5) ($(echo "$exports" | wc -l) findings)"
ok "${exports#check-exports: }"

# Public headers are self-sufficient: each compiles alone, warnings as errors.
for h in "$PREFIX"/include/ferry/*.h; do
    name=ferry/$(basename "$h")
    printf '#include <%s>\nint ferry_header_check_;\n' "$name" >"$TMP/h.c"
    cc -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$PREFIX/include" "$TMP/h.c" \
        2>"$TMP/h.err" || fail "<$name> does not compile on its own: $(head -3 "$TMP/h.err")"
    if command -v c++ >/dev/null; then
        cp "$TMP/h.c" "$TMP/h.cc"
        c++ -Wall -Wextra -Werror -fsyntax-only -I"$PREFIX/include" "$TMP/h.cc" 2>"$TMP/h.err" ||
            fail "<$name> does not compile as C++: $(head -3 "$TMP/h.err")"
    fi
done
ok "$(ls "$PREFIX"/include/ferry/*.h | wc -l) public headers compile on their own$(command -v c++ >/dev/null && echo ' (C11 and C++)')"

# 1. pkg-config alone (ferry.pc; the shared library).
export PKG_CONFIG_PATH=$LIBDIR/pkgconfig
mkdir -p "$TMP/pc"
# shellcheck disable=SC2046
cc -std=c11 -O2 -o "$TMP/pc/classic_lm" "$FERRY_SRC/examples/classic_lm.c" \
    $(pkg-config --cflags --libs ferry) -Wl,-rpath,"$LIBDIR" 2>"$TMP/pc.err" ||
    fail "build with pkg-config: $(head -5 "$TMP/pc.err")"
# The README's command, as a user types it (the loader finds the library through
# LD_LIBRARY_PATH below, as the README says for a prefix outside the default paths).
# shellcheck disable=SC2046
cc -std=c11 -o "$TMP/pc/first_client" "$FERRY_SRC/examples/first_client.c" \
    $(pkg-config --cflags --libs ferry) 2>"$TMP/pc.err" ||
    fail "first_client with pkg-config: $(head -5 "$TMP/pc.err")"
ok "classic_lm and first_client built with pkg-config --cflags --libs ferry ($(pkg-config --modversion ferry))"

# 2. find_package(ferry).
cmake -S "$FERRY_SRC/examples" -B "$TMP/cm" -DCMAKE_PREFIX_PATH="$PREFIX" \
    -DCMAKE_BUILD_RPATH="$LIBDIR" >"$TMP/cm.log" 2>&1 || fail "configure: $(tail -5 "$TMP/cm.log")"
cmake --build "$TMP/cm" >>"$TMP/cm.log" 2>&1 || fail "build: $(tail -5 "$TMP/cm.log")"
[ -x "$TMP/cm/classic_lm" ] && [ -x "$TMP/cm/first_client" ] ||
    fail "find_package build made no classic_lm or first_client"
ok "classic_lm and first_client built out of tree with find_package(ferry)"

# 3. find_package(ferry) and ferry::ferry_static: no libferry.so at run time.
cmake -S "$FERRY_SRC/examples" -B "$TMP/st" -DCMAKE_PREFIX_PATH="$PREFIX" \
    -DFERRY_EXAMPLES_STATIC=ON >"$TMP/st.log" 2>&1 || fail "configure static: $(tail -5 "$TMP/st.log")"
cmake --build "$TMP/st" >>"$TMP/st.log" 2>&1 || fail "build static: $(tail -5 "$TMP/st.log")"
ldd "$TMP/st/classic_lm" >"$TMP/ldd-st" || fail "ldd $TMP/st/classic_lm: $(cat "$TMP/ldd-st")"
grep -q 'libc\.so' "$TMP/ldd-st" || fail "ldd listed no libc for the static client: $(cat "$TMP/ldd-st")"
grep -q 'libferry\.so' "$TMP/ldd-st" && fail "the ferry::ferry_static build loads libferry.so"
ok "classic_lm built against ferry::ferry_static (libferry.a; no libferry.so at run time)"

# No CUDA at link or run time: not in libferry, not in the clients.
for bin in "$LIBDIR/libferry.so" "$TMP/pc/classic_lm" "$TMP/cm/classic_lm" "$TMP/st/classic_lm"; do
    ldd "$bin" >"$TMP/ldd" || fail "ldd $bin"
    grep -qiE 'libcuda|libcudart|libcublas|libcudnn' "$TMP/ldd" && fail "$bin needs CUDA: $(grep -iE 'cud' "$TMP/ldd")"
    grep -q 'not found' "$TMP/ldd" && fail "$bin has unresolved libraries: $(grep 'not found' "$TMP/ldd")"
done
for bin in "$TMP/pc/classic_lm" "$TMP/cm/classic_lm"; do
    grep -q "$LIBDIR/libferry.so" <(ldd "$bin") || fail "$bin does not load the installed libferry"
done
ok "ldd: libferry and the three clients load no CUDA library; the two shared ones load the installed libferry"

# Both train against the installed ferry-ps.
PS_BIN=$PREFIX/bin/ferry-ps start_ps ps --log-level warn
for bin in "$TMP/pc/classic_lm" "$TMP/cm/classic_lm" "$TMP/st/classic_lm"; do
    "$bin" "127.0.0.1:$PORT" 30 >"$TMP/out" 2>"$TMP/err" || fail "$bin exited $?: $(tail -3 "$TMP/err")"
    first=$(awk '/^step/ { print $4; exit }' "$TMP/out")
    last=$(awk '/^step/ { v = $4 } END { print v }' "$TMP/out")
    awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f) }' || fail "$bin: loss $first -> $last"
    ok "$(basename "$(dirname "$bin")")/classic_lm trained against the installed ferry-ps: loss $first -> $last"
done
for bin in "$TMP/pc/first_client" "$TMP/cm/first_client" "$TMP/st/first_client"; do
    LD_LIBRARY_PATH=$LIBDIR "$bin" "127.0.0.1:$PORT" >"$TMP/out" 2>"$TMP/err" ||
        fail "$bin exited $?: $(tail -3 "$TMP/err")"
    last=$(awk '/^step 100 loss/ { print $4 }' "$TMP/out")
    awk -v l="$last" 'BEGIN { exit !(l != "" && l < 1.5) }' || fail "$bin: loss at step 100: '$last'"
    ok "$(basename "$(dirname "$bin")")/first_client trained against the installed ferry-ps: loss $last at step 100"
done
stop_clean "$PS_PID" "the installed ferry-ps" "$TMP/ps.log"
finish
