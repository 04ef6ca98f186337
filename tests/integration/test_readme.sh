#!/usr/bin/env bash
# The README cannot drift from the code: (1) the C program of "Your first client" is
# examples/first_client.c, byte for byte; (2) every flag the command blocks of
# README.md and docker/README.md give ferry-ps, ferry-trainer or ferry-ctl is one that
# binary's --help lists, and every scripts/ file they name exists; (3) the command
# blocks marked <!-- readme-test: run --> run as written, in order, against ferry
# installed into a temporary prefix, in a network namespace of their own (so that their
# fixed port 7000 is free), within a few seconds.
. "$(dirname "$0")/lib.sh"
README=$FERRY_SRC/README.md
CTL=$FERRY_BIN/server/ferry-ctl
PY=/usr/bin/python3

# The fenced block right after each "<!-- readme-test: WHAT -->" line, concatenated.
marked() {
    awk -v m="<!-- readme-test: $1 -->" '
        $0 == m { armed = 1; next }
        armed && /^```/ { armed = 0; inside = 1; next }
        inside && /^```/ { inside = 0; next }
        inside { print }
        armed && !/^[[:space:]]*$/ { armed = 0 }' "$README"
}

# ---- 1. the program shown is the example ---------------------------------------------
marked examples/first_client.c >"$TMP/shown.c"
[ -s "$TMP/shown.c" ] || fail "README.md has no block marked <!-- readme-test: examples/first_client.c -->"
diff -u "$FERRY_SRC/examples/first_client.c" "$TMP/shown.c" >"$TMP/diff" ||
    fail "README.md's first client differs from examples/first_client.c: $(head -20 "$TMP/diff")"
ok "README.md shows examples/first_client.c as it is ($(wc -l <"$TMP/shown.c") lines)"

# ---- 2. flags and scripts named in command blocks exist ---------------------------------
"$PS" --help >"$TMP/help.ferry-ps"
"$TRAINER" --help >"$TMP/help.ferry-trainer"
"$CTL" --help >"$TMP/help.ferry-ctl"
"$PY" - "$TMP" "$FERRY_SRC" "$README" "$FERRY_SRC/docker/README.md" <<'PYEOF' >"$TMP/flags" ||
import re, shlex, sys, os
tmp, src, docs = sys.argv[1], sys.argv[2], sys.argv[3:]
helps = {b: open(f"{tmp}/help.{b}").read() for b in ("ferry-ps", "ferry-trainer", "ferry-ctl")}
bad, checked, scripts = [], 0, 0
for doc in docs:
    text = open(doc).read()
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M):
        block = block.replace("\\\n", " ")
        for line in block.splitlines():
            line = re.sub(r"\s#.*", "", line)
            for cmd in re.split(r"\|\||&&|[|;&]", line):
                try:
                    words = shlex.split(cmd)
                except ValueError:
                    words = cmd.split()
                for i, w in enumerate(words):
                    if w.startswith("scripts/"):
                        scripts += 1
                        if not os.path.exists(os.path.join(src, w)):
                            bad.append(f"{os.path.basename(doc)}: {w} does not exist")
                    b = os.path.basename(w)
                    if b not in helps:
                        continue
                    for f in words[i + 1:]:
                        if not f.startswith("--"):
                            continue
                        name = f.split("=")[0]
                        checked += 1
                        if not re.search(rf"^  {re.escape(name)}( |$)", helps[b], re.M):
                            bad.append(f"{os.path.basename(doc)}: {b} {name} is not in its --help")
if bad:
    print("\n".join(bad))
    sys.exit(1)
print(f"{checked} flags of ferry-ps, ferry-trainer, ferry-ctl and {scripts} scripts/ names")
PYEOF
    fail "README command blocks drifted: $(cat "$TMP/flags")"
ok "the command blocks of README.md and docker/README.md: $(cat "$TMP/flags") all exist"

# ---- 3. the marked command blocks run as written ---------------------------------------
if [ -n "${FERRY_SANITIZE:-}" ]; then
    # The blocks build against the installed library, which needs the sanitizer
    # runtime preloaded in every program; the release stage of scripts/test.sh runs them.
    echo "skipped running the blocks: sanitizer build (${FERRY_SANITIZE})"
    finish
    exit 0
fi
marked run >"$TMP/blocks.sh"
[ -s "$TMP/blocks.sh" ] || fail "README.md has no block marked <!-- readme-test: run -->"
PREFIX=$TMP/prefix
cmake --install "$FERRY_BIN" --prefix "$PREFIX" >"$TMP/install.log" ||
    fail "cmake --install: $(tail -3 "$TMP/install.log")"
LIBDIR=$(dirname "$(find "$PREFIX" -name 'libferry.so' -print -quit)")
mkdir -p "$TMP/work"
for d in examples data scripts; do ln -s "$FERRY_SRC/$d" "$TMP/work/$d"; done
{
    echo 'set -euo pipefail'
    echo 'trap '\''kill $(jobs -p) 2>/dev/null || true'\'' EXIT'
    cat "$TMP/blocks.sh"
    echo 'wait # the servers the blocks started, which they also stopped'
} >"$TMP/run.sh"
export PATH=$PREFIX/bin:$PATH PKG_CONFIG_PATH=$LIBDIR/pkgconfig LD_LIBRARY_PATH=$LIBDIR
run_blocks() { (cd "$TMP/work" && timeout 300 "$@" bash "$TMP/run.sh" >"$TMP/run.out" 2>"$TMP/run.err"); }
t0=$(date +%s)
if [ "$(id -u)" -eq 0 ] && unshare -n true 2>/dev/null && command -v ip >/dev/null; then
    where="in a network namespace of their own"
    run_blocks unshare -n bash -c 'ip link set lo up && exec "$@"' netns ||
        fail "the README's blocks failed: $(tail -5 "$TMP/run.err")"
elif ! (exec 3<>/dev/tcp/127.0.0.1/7000) 2>/dev/null; then
    where="on this machine (port 7000 was free)"
    run_blocks env || fail "the README's blocks failed: $(tail -5 "$TMP/run.err")"
else
    echo "SKIP: cannot run the README's blocks: no network namespace, and port 7000 is in use"
    exit 77
fi
took=$(($(date +%s) - t0))
first=$(awk '/^step  20 loss/ { print $4; exit }' "$TMP/run.out")
last=$(awk '/^step 100 loss/ { print $4; exit }' "$TMP/run.out")
again=$(awk '/^step  20 loss/ { n++; if (n == 2) print $4 }' "$TMP/run.out")
awk -v f="$first" -v l="$last" -v a="$again" 'BEGIN { exit !(f > 3 && l < 1.5 && a < 1) }' ||
    fail "first_client: loss $first -> $last, second run $again: $(cat "$TMP/run.out")"
grep -q "done: 30 steps" "$TMP/run.err" || fail "ferry-trainer did not finish 30 steps: $(tail -3 "$TMP/run.err")"
grep -q "^  first.embedding  *embedding  *\[32 x 16\] .* version [1-9]" "$TMP/run.out" || fail "ferry-ctl modules: $(cat "$TMP/run.out")"
grep -q "shutdown accepted by 1 servers" "$TMP/run.out" || fail "ferry-ctl shutdown: $(cat "$TMP/run.out")"
ok "the README's $(grep -c . "$TMP/blocks.sh") marked commands ran as written $where in $took s: first_client loss $first -> $last (again: $again), 30 trainer steps, modules listed, server shut down"
finish
