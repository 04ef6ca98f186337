#!/usr/bin/env bash
# cpu_bench.sh - what a trained token costs in CPU, every process counted, for each way
# of running the same model, beside the local one-thread trainer measured in the same
# run. CPU (user + sys) rather than wall time: on a 2-core VM and on a cluster it
# means the same thing, the work the system does per token.
#
# Steady state is the difference of two runs, STEPS_LONG and STEPS_SHORT steps (start-up,
# module creation, the first steps' page faults and the final evaluation cancel):
#     CPU per 1,000 tokens = (cpu(long) - cpu(short)) / ((long - short) * tokens per step) * 1000
# where cpu is the sum over every process of the run (the trainers, from their rusage;
# each ferry-ps, from /proc just before its SIGTERM). Placements:
#   local-1t   ferry-trainer --local --threads 1 (the baseline)
#   local-2t   ferry-trainer --local --threads 2 (wall clock only: the bar for the others)
#   ps         1 ferry-ps + 1 trainer: embedding and decoder on the server (small: with
#              --local-vocab 5000, the vocabulary split; medium: --micro-batches 4), the
#              LSTM in the trainer
#   bsp1       1 ferry-ps + a one-rank bsp job: the LSTM's master copy (and the trainer's
#              vocabulary slice) on the server too, pulled and pushed every step; the
#              same --local-vocab / --micro-batches as ps
#   bsp2       2 ferry-ps + 2 bsp ranks (each half the batch columns), the same
# --reps N runs N rounds, each placement once per round (interleaved), and reports
# medians. Also each placement's wall-clock tokens/s over the same steps (and each
# round's ratio to the same round's local-2t), and for the server
# placements the servers' CPU per rank-step beside the time OpenBLAS sgemm takes for
# their own FLOPs (the decoder GEMMs of the rows they hold; bench/gemm_limit).
# bench/cpu_profile.sh splits one placement's CPU by phase.
#
#   bench/cpu_bench.sh [--build DIR] [--config small|medium|all] [--reps N]
#                      [--steps SHORT:LONG] [--wire f32|bf16]
#
# Defaults: build, small, 1 rep, 100:300 steps (the issue's), f32.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BIN=build CONFIGS=small REPS=1 SHORT=100 LONG=300 WIRE=f32
while [ $# -gt 0 ]; do
    case $1 in
    --build) BIN=$2; shift 2 ;;
    --config) CONFIGS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --steps) SHORT=${2%%:*} LONG=${2##*:}; shift 2 ;;
    --wire) WIRE=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--config small|medium|all] [--reps N] [--steps S:L] [--wire f32|bf16]" >&2; exit 2 ;;
    esac
done
[ "$CONFIGS" = all ] && CONFIGS="small medium"
[ "$LONG" -gt "$SHORT" ] || { echo "--steps: LONG must exceed SHORT" >&2; exit 2; }
TMP=$(mktemp -d /tmp/ferry-cpu.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT
export FERRY_PROGRESS=off
HZ=$(getconf CLK_TCK)

echo "machine: $(bench_cpu_model), $(nproc) cores; $(date -u +%FT%TZ); $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "BLAS: OpenBLAS $(bench_kernels "$BIN") kernels, 1 thread per process unless said; wire $WIRE;" \
    "steady state = ${LONG}-step run minus ${SHORT}-step run"

start_ps() { # NAME: a ferry-ps on an ephemeral port; sets PS_PID, PORT
    rm -f "$TMP/$1.port"
    "$BIN/server/ferry-ps" --listen 127.0.0.1:0 --port-file "$TMP/$1.port" --insecure \
        2>"$TMP/$1.log" &
    PS_PID=$!
    for _ in $(seq 200); do [ -s "$TMP/$1.port" ] && break; sleep 0.05; done
    PORT=$(cat "$TMP/$1.port")
}
ps_cpu_stop() { # PID...: their CPU seconds (utime + stime), then SIGTERM and wait
    local t=0 p
    for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
    kill -TERM "$@"
    wait "$@" 2>/dev/null || true
    awk -v t="$t" -v hz="$HZ" 'BEGIN { printf "%.3f\n", t / hz }'
}
trainer() { # OUT_PREFIX ARGS...: runs a trainer under time(1): OUT.time has "wall user sys"
    local out=$1
    shift
    /usr/bin/time -f "%e %U %S" -o "$out.time" "$BIN/worker/ferry-trainer" "$@" \
        --data data/ptb --epochs 1 --eval-tokens 2000 --log-interval 1000 2>"$out.log" ||
        { echo "trainer failed: $(tail -3 "$out.log")" >&2; exit 1; }
}
tcpu() { awk '{ printf "%.3f\n", $2 + $3 }' "$1.time"; }
twall() { awk '{ print $1 }' "$1.time"; }

# run PLACEMENT STEPS: prints "cpu_total wall server_cpu" of one run.
run() {
    local p=$1 n=$2 o="$TMP/$1-$2"
    local common=("${MODEL[@]}" --max-steps "$n" --train-tokens $((n * TPS + 40 * TPS)))
    case $p in
    local-1t) trainer "$o" --local --threads 1 "${common[@]}"; echo "$(tcpu "$o") $(twall "$o") 0" ;;
    local-2t) trainer "$o" --local --threads 2 "${common[@]}"; echo "$(tcpu "$o") $(twall "$o") 0" ;;
    ps)
        start_ps "$p"
        trainer "$o" --ps "127.0.0.1:$PORT" --wire-dtype "$WIRE" "${PSX[@]}" "${common[@]}"
        local s
        s=$(ps_cpu_stop "$PS_PID")
        echo "$(awk -v a="$(tcpu "$o")" -v b="$s" 'BEGIN { print a + b }') $(twall "$o") $s" ;;
    bsp1)
        start_ps "$p"
        trainer "$o" --ps "127.0.0.1:$PORT" --job "cpu-$n" --world 1 --rank 0 --sync bsp \
            --wire-dtype "$WIRE" "${PSX[@]}" "${common[@]}"
        local s
        s=$(ps_cpu_stop "$PS_PID")
        echo "$(awk -v a="$(tcpu "$o")" -v b="$s" 'BEGIN { print a + b }') $(twall "$o") $s" ;;
    bsp2)
        start_ps "$p-a"; local pa=$PS_PID qa=$PORT
        start_ps "$p-b"; local pb=$PS_PID qb=$PORT
        local r pids=()
        for r in 0 1; do
            trainer "$o-r$r" --ps "127.0.0.1:$qa,127.0.0.1:$qb" --job "cpu2-$n" --world 2 \
                --rank "$r" --sync bsp --wire-dtype "$WIRE" "${PSX[@]}" "${common[@]}" &
            pids+=($!)
        done
        wait "${pids[@]}"
        local s
        s=$(ps_cpu_stop "$pa" "$pb")
        awk -v a="$(tcpu "$o-r0")" -v b="$(tcpu "$o-r1")" -v s="$s" \
            -v w0="$(twall "$o-r0")" -v w1="$(twall "$o-r1")" \
            'BEGIN { printf "%.3f %.3f %s\n", a + b + s, (w0 > w1 ? w0 : w1), s }' ;;
    esac
}

for cfg in $CONFIGS; do
    case $cfg in
    small) MODEL=(--preset small) PSX=(--local-vocab 5000) TPS=400 H=200 PSV=5000 ;; # batch 20 x bptt 20
    medium) MODEL=(--preset medium) PSX=(--micro-batches 4) TPS=700 H=650 PSV=10000 ;; # batch 20 x bptt 35
    *) echo "unknown config $cfg" >&2; exit 2 ;;
    esac
    echo
    echo "== $cfg: $TPS tokens per step; ${MODEL[*]}; ps and bsp paths add ${PSX[*]}"
    PLACES="local-1t local-2t ps bsp1 bsp2"
    for p in $PLACES; do : >"$TMP/$p.cpu" >"$TMP/$p.wall" >"$TMP/$p.srv"; done
    # Rounds outermost, every placement once per round: the VM's drift between rounds
    # (often larger than the gaps measured) then falls on every placement alike.
    for rep in $(seq "$REPS"); do
        for p in $PLACES; do
            ranks=1
            [ "$p" = bsp2 ] && ranks=2
            read -r c1 w1 s1 <<<"$(run "$p" "$SHORT")"
            read -r c2 w2 s2 <<<"$(run "$p" "$LONG")"
            d=$((LONG - SHORT))
            awk -v a="$c1" -v b="$c2" -v d="$d" -v t="$TPS" 'BEGIN { print (b - a) / (d * t) * 1000 }' >>"$TMP/$p.cpu"
            awk -v a="$w1" -v b="$w2" -v d="$d" -v t="$TPS" 'BEGIN { print d * t / (b - a) }' >>"$TMP/$p.wall"
            awk -v a="$s1" -v b="$s2" -v d="$d" -v r="$ranks" 'BEGIN { print (b - a) / (d * r) * 1000 }' >>"$TMP/$p.srv"
        done
        echo "round $rep of $REPS, tok/s: $(for p in $PLACES; do printf '%s %.0f  ' "$p" "$(tail -1 "$TMP/$p.wall")"; done)" >&2
    done
    printf "%-9s %12s %8s %10s %9s %14s %10s %8s\n" placement "cpu-s/1k tok" "vs 1t" "tok/s" "vs 2t" \
        "server ms/rank-step" "sgemm ms" "ratio"
    base_cpu= base_wall=
    for p in $PLACES; do
        cpu=$(median <"$TMP/$p.cpu") tok=$(median <"$TMP/$p.wall") srv=$(median <"$TMP/$p.srv")
        [ "$p" = local-1t ] && base_cpu=$cpu
        [ "$p" = local-2t ] && base_wall=$tok
        # The servers' own FLOPs per rank-step (the decoder's GEMMs over the rows they
        # hold) at OpenBLAS's one-thread sgemm rate on those shapes, measured now.
        lim=-
        case $p in
        ps) lim=$("$BIN/bench/gemm_limit" "$TPS" "$H" "$PSV" | cut -d' ' -f1) ;;
        bsp1) lim=$("$BIN/bench/gemm_limit" "$TPS" "$H" "$PSV" | cut -d' ' -f1) ;;
        bsp2) lim=$("$BIN/bench/gemm_limit" $((TPS / 2)) "$H" "$PSV" | cut -d' ' -f1) ;;
        esac
        printf "%-9s %12.3f %7.2fx %10.0f %8s %14s %10s %8s\n" "$p" "$cpu" \
            "$(awk -v a="$cpu" -v b="$base_cpu" 'BEGIN { print a / b }')" "$tok" \
            "$([ -n "$base_wall" ] && awk -v a="$tok" -v b="$base_wall" 'BEGIN { printf "%.2fx", a / b }' || echo -)" \
            "$([ "$p" = local-1t ] || [ "$p" = local-2t ] && echo - || printf "%.1f" "$srv")" "$lim" \
            "$([ "$lim" = - ] && echo - || awk -v a="$srv" -v b="$lim" 'BEGIN { printf "%.2fx", a / b }')"
    done
    # Each round's wall clock against the same round's local trainer on two threads.
    for p in ps bsp1 bsp2; do
        printf "%-9s vs 2t by round: %s\n" "$p" \
            "$(paste -d' ' "$TMP/$p.wall" "$TMP/local-2t.wall" | awk '{ printf "%.2fx ", $1 / $2 }')"
    done
done
echo
echo "cpu-s/1k tok: CPU seconds (user + sys, every process) per 1,000 job tokens, steady state;"
echo "vs 1t: against the local one-thread trainer; tok/s and vs 2t: wall clock, against the local"
echo "trainer on two threads; server ms/rank-step: every ferry-ps's CPU per step of one rank;"
echo "sgemm ms: the servers' decoder GEMMs of one rank-step at the one-thread sgemm rate"
echo "(bench/gemm_limit, same run), and ratio the servers' CPU against it."
