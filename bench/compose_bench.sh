#!/usr/bin/env bash
# compose_bench.sh - docker/compose.yml's job (2 ferry-ps + 2 bsp ranks) in containers
# beside the same job run natively with the same flags, interleaved in one run: the
# job's tokens/s and the ratio. Each placement runs REPS times; medians are reported.
#
#   bench/compose_bench.sh [--reps N] [--build DIR] [--image IMAGE] [--variant NAME]...
#                          [--cgroups]
#
# Placements:
#   native     build/'s ferry-ps and ferry-trainer on loopback (the baseline)
#   compose    docker/compose.yml as docker/README.md runs it (IMAGE, default ferry:latest)
#   VARIANT    compose with docker/compose.VARIANT.yml layered on top (each --variant)
#   native-cg  (--cgroups) native, but each process in a cpu cgroup of its own, as docker
#              puts each container: separates the scheduling from the rest of docker
# The job: PTB small, one epoch of 120,000 training tokens (the ranks split each
# step's batch columns), checkpoints every 200 steps, as scripts/docker-job.sh runs it.
# The figure is the epoch's tokens/s as rank 0 logs it ("epoch 1 done"); the epoch's
# clock starts at its first step, so start-up and the final evaluation are not in it.
# Needs a running dockerd and the image (scripts/docker-job.sh makes both).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
REPS=3 BIN=build IMAGE=ferry:latest VARIANTS=() CGROUPS=0
while [ $# -gt 0 ]; do
    case $1 in
    --reps) REPS=$2; shift 2 ;;
    --build) BIN=$2; shift 2 ;;
    --image) IMAGE=$2; shift 2 ;;
    --variant) VARIANTS+=("$2"); shift 2 ;;
    --cgroups) CGROUPS=1; shift ;;
    *) echo "usage: $0 [--reps N] [--build DIR] [--image IMAGE] [--variant NAME]... [--cgroups]" >&2; exit 2 ;;
    esac
done
ARGS="--epochs 1 --train-tokens 120000 --eval-tokens 10000 --log-interval 100"
project=ferrybench
TMP=$(mktemp -d /tmp/ferry-compose.XXXXXX)
compose() { # [VARIANT] -- ARGS...
    local files=(-f docker/compose.yml)
    [ "$1" != -- ] && files+=(-f "docker/compose.$1.yml") && shift
    shift
    if docker compose version >/dev/null 2>&1; then docker compose -p "$project" "${files[@]}" "$@"
    else docker-compose -p "$project" "${files[@]}" "$@"; fi
}
CG=/sys/fs/cgroup/cpu # cgroup v1's cpu hierarchy (what docker.io 20.10 uses here)
if [ "$CGROUPS" = 1 ] && [ ! -w "$CG/cgroup.procs" ]; then
    echo "--cgroups needs cgroup v1's cpu hierarchy at $CG, writable (root)" >&2
    exit 2
fi
cg_put() { # NAME PID: PID into a cpu cgroup of its own (--cgroups)
    [ "$CGROUPS" = 1 ] || return 0
    mkdir -p "$CG/$project-$1" && echo "$2" >"$CG/$project-$1/cgroup.procs"
}
cg_clear() {
    [ "$CGROUPS" = 1 ] || return 0
    local g
    for g in "$CG/$project"-*; do [ -d "$g" ] && rmdir "$g" 2>/dev/null; done
    return 0
}
cleanup() {
    kill $(jobs -p) 2>/dev/null || true
    cg_clear
    compose -- down -v >/dev/null 2>&1 || true
    rm -rf "$TMP"
}
trap cleanup EXIT
docker image inspect "$IMAGE" >/dev/null 2>&1 ||
    { echo "no image $IMAGE: run scripts/docker-job.sh first (it builds it)" >&2; exit 1; }

echo "machine: $(bench_cpu_model), $(nproc) cores; $(date -u +%FT%TZ); $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "job: 2 ferry-ps + 2 bsp ranks, PTB small, $ARGS"

epoch_tps() { # LOG: rank 0's epoch tokens/s
    grep -m1 "epoch 1 done" "$1" | sed 's/.*steps, \([0-9.]*\) tokens\/s.*/\1/'
}
kernels() { # LOG
    grep -m1 -o "OpenBLAS: [^,;)]*" "$1" || true
}

run_native() { # [cg] -> tokens/s on stdout
    local cg=${1:-} d=$TMP/native ports=() servers=()
    rm -rf "$d" && mkdir -p "$d/ck0" "$d/ck1"
    for s in 0 1; do
        "$BIN/server/ferry-ps" --listen 127.0.0.1:0 --port-file "$d/ps$s.port" --insecure \
            --server-id "ps$s" --checkpoint-dir "$d/ck$s" 2>"$d/ps$s.log" &
        servers+=($!)
        [ -n "$cg" ] && cg_put "ps$s" $!
    done
    for s in 0 1; do
        for _ in $(seq 100); do [ -s "$d/ps$s.port" ] && break; sleep 0.1; done
        ports+=("$(cat "$d/ps$s.port")")
    done
    local pids=()
    for r in 0 1; do
        # shellcheck disable=SC2086 # ARGS holds several flags
        FERRY_PROGRESS=plain FERRY_WORLD=2 FERRY_RANK=$r "$BIN/worker/ferry-trainer" \
            --ps "127.0.0.1:${ports[0]},127.0.0.1:${ports[1]}" --job compose --sync bsp \
            --data data/ptb --save "$d/lm.ck" --checkpoint-every 200 \
            --metrics-out "$d/rank$r.jsonl" $ARGS >"$d/rank$r.log" 2>&1 &
        pids+=($!)
        [ -n "$cg" ] && cg_put "rank$r" $!
    done
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    kill "${servers[@]}" 2>/dev/null || true
    wait "${servers[@]}" 2>/dev/null || true
    cg_clear
    [ "$rc" = 0 ] || { echo "native: a rank failed: $(tail -n 3 "$d"/*.log)" >&2; exit 1; }
    cp "$d/rank0.log" "$TMP/native.last.log"
    epoch_tps "$d/rank0.log"
}

run_compose() { # [VARIANT|--] -> tokens/s on stdout
    local v=$1 log=$TMP/compose.log
    FERRY_TRAINER_ARGS="$ARGS" compose "$v" -- up --no-build -d >/dev/null 2>&1
    local rc0 rc1
    rc0=$(docker wait "$(compose "$v" -- ps -q rank0)")
    rc1=$(docker wait "$(compose "$v" -- ps -q rank1)")
    compose "$v" -- logs --no-color rank0 >"$log" 2>&1
    compose "$v" -- down -v >/dev/null 2>&1
    [ "$rc0" = 0 ] && [ "$rc1" = 0 ] || { echo "compose $v: a rank exited $rc0/$rc1: $(tail -n 3 "$log")" >&2; exit 1; }
    cp "$log" "$TMP/compose$v.last.log"
    epoch_tps "$log"
}

placements=(native)
[ "$CGROUPS" = 1 ] && placements+=(native-cg)
placements+=(compose "${VARIANTS[@]}")
for ((rep = 1; rep <= REPS; rep++)); do
    for p in "${placements[@]}"; do
        case $p in
        native) tps=$(run_native) ;;
        native-cg) tps=$(run_native cg) ;;
        compose) tps=$(run_compose --) ;;
        *) tps=$(run_compose "$p") ;;
        esac
        echo "$tps" >>"$TMP/$p.tps"
        printf 'rep %d %-12s %8.0f tokens/s\n' "$rep" "$p" "$tps"
    done
done
echo "kernels: native $(kernels "$TMP/native.last.log"); compose $(kernels "$TMP/compose--.last.log")"
base=$(median <"$TMP/native.tps")
printf '%-12s %10s %8s\n' placement "tokens/s" "x native"
for p in "${placements[@]}"; do
    m=$(median <"$TMP/$p.tps")
    printf '%-12s %10.0f %8.2f\n' "$p" "$m" "$(echo "$m / $base" | bc -l)"
done
