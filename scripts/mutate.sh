#!/usr/bin/env bash
# Mutation check of the test suite, run by hand (not in CI: it takes about half an
# hour on 2 cores). Copies the working tree to a scratch directory, builds it once
# (Release), runs every test named below on the unchanged copy (all must pass: the
# control), then breaks one core behaviour at a time with a literal text replacement
# in one source file, rebuilds what the tests need, runs the tests chosen for that
# behaviour and puts the file back. It prints a table of which tests failed on each
# break; a break that no test notices is SURVIVED, and the script then exits 1. A
# replacement that no longer matches the source (the code moved) is NOT APPLIED and
# counts as a failure of the script too: update its text.
#
#   scripts/mutate.sh                       every mutation
#   scripts/mutate.sh --only parity,sweep   some of them (names: first column)
#   scripts/mutate.sh --list                the mutations, their tests, and whether
#                                           their text is still in the tree
#   scripts/mutate.sh --out FILE            the table (markdown) also to FILE
#   scripts/mutate.sh --work DIR            scratch directory, kept and reused
#                                           (default: a new one under /tmp, removed)
#
# A test is a ctest name (test_x: the whole executable or integration script) or
# test_x:case (one TEST of a C test executable, run directly). Set FERRY_CPU_LOCK to a
# lock file to run every build and test under `flock` (a shared machine).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
work="" out="" only="" list=0
while [ $# -gt 0 ]; do
    case "$1" in
    --work) work=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --list) list=1; shift ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "mutate.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

# ---- the mutations ----------------------------------------------------------------
# NAME|FILE|WHAT IT BREAKS|TESTS (space-separated)|OLD TEXT|NEW TEXT
# OLD must occur exactly once in FILE. Extra replacements in the same file follow as
# further OLD|NEW pairs.
MUTATIONS=(
"restore-values|server/checkpoint.c|a restored module's weights are zeros, not the file's|test_ps_hostile:checkpoint_of_4200_modules test_ps_contexts:checkpoint_restores_parameters_and_optimizer_state|    ferry_ckcur_f32s(&c, m->P.data, (size_t)numel);|    ferry_ckcur_f32s(&c, m->P.data, (size_t)numel); memset(m->P.data, 0, (size_t)numel * sizeof(float));"
"micro-batches-ignored|worker/model.c|--micro-batches M is accepted and ignored (the step stays unpipelined)|test_pipeline test_stages:two_stages_dropout_on_pipelined test_dist_job:bsp_stages_match_local|    return M == 1 ? FERRY_OK : ferry_lm_pipe_create(M, &lm->pipe);|    return FERRY_OK;"
"pipeline-loss-float|worker/pipeline.c|the pipeline sums its micro-batches' losses in float (M = 1 no longer the unpipelined step bit for bit)|test_pipeline:one_micro_batch_is_the_unpipelined_step test_pipeline:dropout_on_matches|        *loss_sum += p->loss[c];|        *loss_sum += (double)(float)p->loss[c];"
"pipeline-dropout-window|worker/pipeline.c|each micro-batch draws the dropout masks of the window's first time steps, not its own|test_pipeline:dropout_off_matches test_pipeline:dropout_on_matches test_stages:two_stages_dropout_on_pipelined|    ferry_ctx_set_window(ctx, T, B, t0, steps, 0, B);|    ferry_ctx_set_window(ctx, T, B, 0, steps, 0, B);"
"rollback-oldest|worker/recovery.c|recovery rolls the job back to the oldest common checkpoint, not the newest (replay is deterministic: the final state is still identical)|test_recovery|        size_t no = nmine < 1024 ? nmine : 1024;|        size_t no = 1;|            offer[i] = (uint64_t)mine[nmine - no + i];|            offer[i] = (uint64_t)mine[i];"
"parity-server-step|server/handlers.c|ferry-ps scales every update by 1 + 2^-20 (the trainer's own step is exact)|test_dist_parity test_stages:two_stages_dropout_off test_pipeline:dropout_off_matches|        st = ferry_optim_step(m->opt, &m->P, &cm->G, (float)scale);|        st = ferry_optim_step(m->opt, &m->P, &cm->G, (float)scale * (1.0f + 0x1p-20f));"
"bsp-sum-rank0|server/jobs.c|a bsp step applies rank 0's gradient only, not the ranks' sum|test_dist_job:bsp_two_ranks_match_local|            st = e != NULL ? ferry_grads_add(&e->G, &c->mods[i].G) : FERRY_NOMEM();|            st = e != NULL ? (r == 0 ? ferry_grads_add(&e->G, &c->mods[i].G) : FERRY_OK) : FERRY_NOMEM();"
"stiefel-every-rank|worker/model.c|every rank of a job adds the Stiefel penalty's gradient, not rank 0 alone|test_dist_job:bsp_two_ranks_match_local test_dist_job:bsp_stiefel_matches_local|    int owner = lm->job == NULL \|\| ferry_job_get_config(lm->job)->rank == 0;|    int owner = 1;"
"ssp-bound|server/jobs.c|ssp:K lets a rank run K + 1 steps ahead|test_job_cluster|        if (lead > job->K && !j->stopped && job->failed[0] == '\\0') {|        if (lead > job->K + 1 && !j->stopped && job->failed[0] == '\\0') {"
"token-check|common/rpc/server.c|any bearer token is taken for the token table's last identity|test_security test_tls_errors|            if (same_secret(tok, n, srv->ids[i].token, srv->ids[i].token_len))|            if (1)"
"ownership|server/ps-impl.h|any identity may use another identity's modules and jobs|test_security test_load|    return s->authority \|\| strcmp(s->identity, owner) == 0;|    return 1;"
"ctx-session|server/ctx-table.c|a context is found by its id from any session, not only the one that made it|test_sessions test_security|    id ^= sess * 0x9E3779B97F4A7C15ull;|    (void)sess;|    while (c != NULL && (c->id != id \|\| c->sess != sess))|    while (c != NULL && c->id != id)"
"sweep|server/ctx-table.c|idle contexts are never swept|test_ps_contexts:idle_context_is_swept_and_its_memory_freed test_dist_failures|            if (c->refs == 0 && now - c->last_used > t->ttl_s) {|            if (0) {"
"crc-check|common/core/ckfile.c|a checkpoint section whose CRC-32 does not match is accepted (read and streamed verify)|test_trainer_errors test_recovery test_ckfile|        uint32_t have = crc_update((uint32_t)crc32(0L, Z_NULL, 0), b, (size_t)len);|        uint32_t have = want;|        uint32_t want = (uint32_t)le_get(tail, 4);|        uint32_t want = have;"
)

field() { # field N LINE: the Nth |-separated field (\| is a literal |)
    printf '%s\n' "$2" | sed 's/\\|/\x01/g' | cut -d'|' -f"$1" | tr '\001' '|'
}
nfields() { printf '%s\n' "$1" | sed 's/\\|/\x01/g' | awk -F'|' '{ print NF }'; }

if [ "$list" = 1 ]; then # each mutation, its tests, and whether its text is in the tree
    for m in "${MUTATIONS[@]}"; do
        matches=yes
        for ((k = 5; k < $(nfields "$m"); k += 2)); do
            OLD=$(field "$k" "$m") perl -0777 -ne '$n = () = /\Q$ENV{OLD}\E/g; exit($n == 1 ? 0 : 3)' \
                "$src/$(field 2 "$m")" || matches="NO (update the text)"
        done
        printf '%-24s %-22s %s\n    tests: %s\n    text found once: %s\n' "$(field 1 "$m")" \
            "$(field 2 "$m")" "$(field 3 "$m")" "$(field 4 "$m")" "$matches"
    done
    exit 0
fi

locked() { # runs "$@" under flock $FERRY_CPU_LOCK when it is set
    if [ -n "${FERRY_CPU_LOCK:-}" ]; then flock "$FERRY_CPU_LOCK" "$@"; else "$@"; fi
}

selected=()
for m in "${MUTATIONS[@]}"; do
    name=$(field 1 "$m")
    if [ -z "$only" ] || [[ ",$only," == *",$name,"* ]]; then selected+=("$m"); fi
done
[ ${#selected[@]} -gt 0 ] || { echo "mutate.sh: no mutation named '$only' (--list)" >&2; exit 2; }

# ---- the scratch copy and its build ------------------------------------------------
keep=1
if [ -z "$work" ]; then
    work=$(mktemp -d /tmp/ferry-mutate.XXXXXX)
    keep=0
fi
mkdir -p "$work/src"
trap '[ "$keep" = 1 ] || rm -rf "$work"' EXIT
# Tracked files and new ones not ignored, as they are in the working tree now.
(cd "$src" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) |
    tar -xf - -C "$work/src"
S=$work/src B=$work/build
echo "== scratch copy in $work; configure and build (Release) =="
# Without -Werror: a mutation may leave a variable unused, and that is not a test failing.
locked cmake -S "$S" -B "$B" -DCMAKE_BUILD_TYPE=Release >"$work/configure.log"
locked cmake --build "$B" -j"$(nproc)" >"$work/build.log" 2>&1 ||
    { tail -20 "$work/build.log"; exit 1; }

# targets TEST...: the build targets the tests need
targets() {
    local t name
    for t in "$@"; do
        name=${t%%:*}
        if [ -e "$S/tests/integration/$name.sh" ]; then
            echo ferry-ps ferry-trainer ferry-ctl ferry_stats
        else
            echo "$name"
        fi
    done | tr ' ' '\n' | sort -u
}

# run_test TEST LOG: 0 pass, 1 fail, 77 skipped
run_test() {
    local t=$1 log=$2 name=${1%%:*} case= rc=0
    [ "$t" != "$name" ] && case=${t#*:}
    if [ -n "$case" ]; then
        (cd "$B/tests" && locked timeout 1200 "./$name" "$case") >"$log" 2>&1 || rc=$?
    else
        locked timeout 1800 ctest --test-dir "$B" -R "^$name\$" --output-on-failure \
            >"$log" 2>&1 || rc=$?
        if [ "$rc" = 0 ] && grep -q '\*\*\*Skipped' "$log"; then rc=77; fi
        if grep -q "No tests were found" "$log"; then rc=2; fi
    fi
    case $rc in 0) return 0 ;; 77) return 77 ;; *) return 1 ;; esac
}

# apply FILE OLD NEW: literal replacement of OLD, which must occur exactly once
apply() {
    OLD=$2 perl -0777 -ne '$n = () = /\Q$ENV{OLD}\E/g; exit($n == 1 ? 0 : 3)' "$S/$1" || return 1
    OLD=$2 NEW=$3 perl -0777 -pi -e 's/\Q$ENV{OLD}\E/$ENV{NEW}/' "$S/$1"
}

# ---- the control: every test passes on the unchanged copy ----------------------------
all_tests=$(for m in "${selected[@]}"; do field 4 "$m"; done | tr ' ' '\n' | sort -u)
echo "== control: $(echo $all_tests | wc -w) tests on the unchanged tree =="
# shellcheck disable=SC2046
locked cmake --build "$B" -j"$(nproc)" --target $(targets $all_tests) >>"$work/build.log" 2>&1
control_ok=1
for t in $all_tests; do
    rc=0
    run_test "$t" "$work/control-${t//:/-}.log" || rc=$?
    if [ "$rc" = 0 ]; then echo "  pass  $t"; elif [ "$rc" = 77 ]; then echo "  skip  $t"; else
        echo "  FAIL  $t (see $work/control-${t//:/-}.log)"; control_ok=0; fi
done
[ "$control_ok" = 1 ] || { echo "mutate.sh: the unchanged tree fails; fix that first" >&2; keep=1; exit 1; }

# ---- the mutations -----------------------------------------------------------------
rows=() bad=0 i=0
for m in "${selected[@]}"; do
    i=$((i + 1))
    name=$(field 1 "$m") file=$(field 2 "$m") what=$(field 3 "$m") tests=$(field 4 "$m")
    echo "== $i/${#selected[@]} $name ($file): $what =="
    cp "$S/$file" "$work/orig"
    applied=1
    n=$(nfields "$m")
    for ((k = 5; k < n; k += 2)); do
        apply "$file" "$(field "$k" "$m")" "$(field $((k + 1)) "$m")" || applied=0
    done
    failed=() passed=() skipped=() built=1
    if [ "$applied" = 1 ]; then
        t0=$(date +%s)
        # shellcheck disable=SC2046
        if ! locked cmake --build "$B" -j"$(nproc)" --target $(targets $tests) \
            >"$work/build-$name.log" 2>&1; then
            built=0
        else
            for t in $tests; do
                rc=0
                run_test "$t" "$work/$name-${t//:/-}.log" || rc=$?
                case $rc in 0) passed+=("$t") ;; 77) skipped+=("$t") ;; *) failed+=("$t") ;; esac
            done
        fi
        echo "   failed: ${failed[*]:-none}; passed: ${passed[*]:-none} ($(($(date +%s) - t0)) s)"
    fi
    cp "$work/orig" "$S/$file"
    touch "$S/$file" # the next build recompiles it
    if [ "$applied" = 0 ]; then
        verdict="NOT APPLIED (the text moved)"
        bad=1
    elif [ "$built" = 0 ]; then
        verdict="BUILD FAILED (see $work/build-$name.log)"
        bad=1
        keep=1
    elif [ ${#failed[@]} -gt 0 ]; then
        verdict=caught
    else
        verdict=SURVIVED
        bad=1
    fi
    rows+=("| $i | \`$name\` | $what (\`$file\`) | ${failed[*]:-none} | ${passed[*]:-none}${skipped[*]:+; skipped: ${skipped[*]}} | $verdict |")
done

table=$(
    echo "| # | mutation | what it breaks (file) | tests that failed | tests that passed | verdict |"
    echo "|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
)
echo
echo "$table"
if [ -n "$out" ]; then
    {
        echo "Mutation check: scripts/mutate.sh on $(cd "$src" && git rev-parse --short HEAD)$(cd "$src" && git diff --quiet HEAD || echo ' (with uncommitted changes)'), $(date -u +%Y-%m-%d), Release build."
        echo "Control: all $(echo $all_tests | wc -w) tests passed on the unchanged tree."
        echo
        echo "$table"
    } >"$out"
fi
exit "$bad"
