#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for a bounded time
# on a copy of its seed corpus. Any crash, leak, sanitizer report or timeout is a
# finding: the script stops with the reproducer's path and exits 1.
#
#   scripts/fuzz.sh                     every target, 20 s each (what CI runs)
#   scripts/fuzz.sh --seconds 3600 fuzz_ps_forward   a longer campaign of one target
#   scripts/fuzz.sh --record            re-record the seeds (tests/fuzz/corpus) from
#                                       the requests the ps tests really send
# New inputs the fuzzer finds go to build-fuzz/corpus/<target>, never into the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=20
record=0
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --record) record=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
    esac
done
bash scripts/deps.sh clang libclang-rt-14-dev
jobs=$(nproc)

echo "== fuzz build (clang, libFuzzer, ASan + UBSan, warnings as errors) =="
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DFERRY_FUZZ=ON -DFERRY_CUDA=OFF -DFERRY_WERROR=ON \
    -DFERRY_SANITIZE='address;undefined' -DCMAKE_C_FLAGS='-fsanitize=fuzzer-no-link' >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz

methods=(Hello CreateModule Forward Backward GradNorm Step ReleaseContext GetParams SetParams
         Checkpoint Stats Shutdown Job)
snake() { echo "$1" | sed -E 's/([a-z])([A-Z])/\1_\2/g' | tr 'A-Z' 'a-z'; }

if [ "$record" = 1 ]; then
    echo "== recording seeds from the ps tests =="
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build -j"$jobs" --target test_ps_modules test_ps_errors test_ps_stiefel \
        test_ps_contexts test_dist_parity test_dist_job >/dev/null
    rec=$(mktemp -d)
    for t in test_ps_modules test_ps_errors test_ps_stiefel test_ps_contexts test_dist_parity \
        test_dist_job; do
        FERRY_RPC_RECORD=$rec FERRY_LOG=error build/tests/$t >/dev/null 2>&1 || true
    done
    rm -rf tests/fuzz/corpus/fuzz_codec tests/fuzz/corpus/fuzz_ps_* # fuzz_reshard's: scripts/fuzz-reshard-seeds.sh
    for i in "${!methods[@]}"; do
        m=${methods[$i]}
        dir=tests/fuzz/corpus/fuzz_ps_$(snake "$m")
        mkdir -p "$dir" tests/fuzz/corpus/fuzz_codec
        for f in "$rec"/"$m"-*.bin; do
            [ -e "$f" ] || continue
            [ "$(stat -c %s "$f")" -le 65536 ] || continue # small seeds mutate faster
            cp "$f" "$dir/"
            # fuzz_codec: byte 0 = method (request type), byte 1 = 0 (one chunk).
            { printf "\\x$(printf %02x "$i")\\x00"; cat "$f"; } \
                >"tests/fuzz/corpus/fuzz_codec/$(basename "$f")"
        done
    done
    rm -rf "$rec"
    echo "seeds: $(find tests/fuzz/corpus -type f | wc -l) files in tests/fuzz/corpus"
fi

if [ ${#targets[@]} -eq 0 ]; then
    targets=(fuzz_codec)
    for m in "${methods[@]}"; do targets+=("fuzz_ps_$(snake "$m")"); done
    targets+=(fuzz_reshard)
fi
mkdir -p build-fuzz/corpus build-fuzz/findings
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
printf "%-24s %10s %8s %8s  %s\n" target runs cov ft corpus
for t in "${targets[@]}"; do
    work=build-fuzz/corpus/$t
    mkdir -p "$work"
    [ -d "tests/fuzz/corpus/$t" ] && cp -n tests/fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
    log=build-fuzz/$t.log
    if ! build-fuzz/tests/fuzz/$t "$work" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -max_len=65536 -artifact_prefix=build-fuzz/findings/"$t"- -print_final_stats=1 >"$log" 2>&1; then
        echo "FINDING in $t: $(grep -m1 -E 'ERROR|SUMMARY|Test unit written' "$log" || tail -n 3 "$log")" >&2
        ls build-fuzz/findings/"$t"-* >&2 2>/dev/null || true
        exit 1
    fi
    runs=$(grep -m1 -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo ?)
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -n1 | grep -oE '[0-9]+' || echo ?)
    ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -n1 | grep -oE '[0-9]+' || echo ?)
    printf "%-24s %10s %8s %8s  %s\n" "$t" "$runs" "$cov" "$ft" "$(ls "$work" | wc -l) inputs"
done
echo "fuzz: ${#targets[@]} targets x ${seconds} s, no finding"
