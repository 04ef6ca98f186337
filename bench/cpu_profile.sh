#!/usr/bin/env bash
# cpu_profile.sh - where each process's CPU goes in one placement of bench/cpu_bench.sh,
# split by phase: Linux perf samples ferry-ps and the trainer (every thread) over a
# run, and each sampled function is put in one phase by its name and library:
#   compute      OpenBLAS kernels and ferry's own numeric loops (nn, tensor ops, softmax)
#   optimizer    the optimizer update and the gradient norm
#   zeroing      memset and the backend's fill (gradient blocks cleared)
#   copies       memcpy/memmove, ferry's codec (encode, decode) and bf16 conversions
#   grpc         gRPC core, abseil, protobuf-c, TLS (the library code of a call)
#   kernel       the kernel: syscalls, TCP, page faults, scheduling
#   waiting      completion-queue polling and spinning (epoll, ferry's spin)
#   other        the rest (the malloc family, libc, ferry's control code)
# with each process's CPU seconds per rank-step beside it (from /proc, as cpu_bench.sh),
# and OpenBLAS sgemm's time for the server's own decoder GEMMs (bench/gemm_limit).
#
#   bench/cpu_profile.sh [--build DIR] [--placement bsp1|ps] [--config small|medium]
#                        [--steps N] [--wire f32|bf16]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build PLACE=bsp1 CFG=small STEPS=200 WIRE=f32
while [ $# -gt 0 ]; do
    case $1 in
    --build) BIN=$2; shift 2 ;;
    --placement) PLACE=$2; shift 2 ;;
    --config) CFG=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --wire) WIRE=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--placement bsp1|ps] [--config small|medium] [--steps N] [--wire f32|bf16]" >&2; exit 2 ;;
    esac
done
command -v perf >/dev/null || { echo "cpu_profile.sh needs Linux perf (apt install linux-perf)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "cpu_profile.sh needs /usr/bin/time (apt install time)" >&2; exit 2; }
case $CFG in
small) MODEL=(--preset small) PSX=(--local-vocab 5000) TPS=400 N=400 H=200 V=10000 ;;
medium) MODEL=(--preset medium) PSX=(--micro-batches 4) TPS=700 N=700 H=650 V=10000 ;;
*) echo "unknown config $CFG" >&2; exit 2 ;;
esac
TMP=$(mktemp -d /tmp/ferry-prof.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT
export FERRY_PROGRESS=off
HZ=$(getconf CLK_TCK)

"$BIN/server/ferry-ps" --listen 127.0.0.1:0 --port-file "$TMP/port" --insecure 2>"$TMP/ps.log" &
PS=$!
for _ in $(seq 200); do [ -s "$TMP/port" ] && break; sleep 0.05; done
PORT=$(cat "$TMP/port")
case $PLACE in
bsp1) X=(--job prof --world 1 --rank 0 --sync bsp) VS=$V ;;
ps) X=("${PSX[@]}") VS=$V
    [ "$CFG" = small ] && VS=$((V - 5000)) ;;
*) echo "unknown placement $PLACE" >&2; exit 2 ;;
esac
perf record -q -F 997 -p "$PS" -o "$TMP/ps.data" 2>/dev/null &
PERF=$!
sleep 0.5
perf record -q -F 997 -o "$TMP/tr.data" -- /usr/bin/time -f "%U %S" -o "$TMP/tr.time" \
    "$BIN/worker/ferry-trainer" --ps "127.0.0.1:$PORT" \
    --wire-dtype "$WIRE" "${X[@]}" "${MODEL[@]}" --max-steps "$STEPS" \
    --train-tokens $(((STEPS + 40) * TPS)) --data data/ptb --epochs 1 --eval-tokens 2000 \
    --log-interval 1000 2>"$TMP/tr.log" >/dev/null ||
    { echo "trainer failed: $(tail -3 "$TMP/tr.log")" >&2; exit 1; }
kill -INT "$PERF"
wait "$PERF" 2>/dev/null || true
pscpu=$(awk -v hz="$HZ" '{ printf "%.3f", ($14 + $15) / hz }' "/proc/$PS/stat")
kill -TERM "$PS"
wait "$PS" 2>/dev/null || true

# perf's per-symbol self shares -> phases.
phases() { # DATA: "phase percent" lines
    perf report -i "$1" --stdio --no-children --sort dso,sym 2>/dev/null |
        awk '/^ *[0-9.]+%/ {
            p = $1; sub("%", "", p); d = $2; s = "";
            for (i = 4; i <= NF; i++) s = s " " $i;
            ph = "other";
            if (d ~ /kernel/ || $3 == "[k]") ph = "kernel";
            else if (s ~ /memset|_fill/) ph = "zeroing";
            else if (s ~ /memcpy|memmove|ferry__rpc_(encode|decode)|bf16|decode_tensor|wire_/) ph = "copies";
            else if (s ~ /optim|sgd|adam|sumsq|clip/) ph = "optimizer";
            else if (d ~ /openblas|blas/ || s ~ /sgemm|gemm|_kernel|exp|softmax|lstm|sigmoid|tanh|ferry_backend_cpu|cpu_/) ph = "compute";
            else if (s ~ /epoll|poll|spin|pollset|cq_next|completion_queue/) ph = "waiting";
            else if (d ~ /grpc|gpr|absl|protobuf|ssl|crypto|upb|address_sorting/) ph = "grpc";
            share[ph] += p
        }
        END { for (k in share) printf "%s %.1f\n", k, share[k] }'
}
printf "machine: %s, %s cores; %s; %s\n" "$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" \
    "$(nproc)" "$(date -u +%FT%TZ)" "$(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "placement $PLACE, $CFG, $STEPS steps, wire $WIRE; perf at 997 Hz per thread"
limit=$("$BIN/bench/gemm_limit" "$N" "$H" "$VS")
printf "ferry-ps: %.1f ms CPU per rank-step (whole run, start-up included); its decoder GEMMs at the sgemm rate: %s ms (%s GFLOP at %s GFLOP/s, 1 thread)\n" \
    "$(awk -v c="$pscpu" -v s="$STEPS" 'BEGIN { print c / s * 1000 }')" $limit
printf "trainer: %.1f ms CPU per rank-step (whole run, start-up included)\n" \
    "$(awk -v s="$STEPS" '{ print ($1 + $2) / s * 1000 }' "$TMP/tr.time")"
printf "%-10s %9s %9s\n" phase ferry-ps trainer
join -a1 -a2 -e 0 -o 0,1.2,2.2 <(phases "$TMP/ps.data" | sort) <(phases "$TMP/tr.data" | sort) |
    sort -k2,2gr | awk '{ printf "%-10s %8.1f%% %8.1f%%\n", $1, $2, $3 }'
for who in ps tr; do
    echo
    echo "top functions of $([ $who = ps ] && echo ferry-ps || echo the trainer) (self):"
    perf report -i "$TMP/$who.data" --stdio --no-children --sort dso,sym 2>/dev/null |
        awk '/^ *[0-9.]+%/' | head -20 || true
done
