#!/usr/bin/env bash
#SBATCH --job-name=ferry
#SBATCH --ntasks=2
#SBATCH --output=ferry-%j.out
# A ferry job under Slurm: K ferry-ps servers as one job step (spread cyclically over
# the allocation's nodes, server i on port PORT+i), then the trainers as a second step
# of --ntasks ranks, each taking its rank and the world size from Slurm
# (SLURM_PROCID, SLURM_NTASKS), with the job named after Slurm's job id. The servers
# stop when the trainers are done.
#
#   sbatch --ntasks=4 scripts/slurm-job.sh --epochs 1          # 4 ranks
#   FERRY_SERVERS=4 sbatch -N 4 --ntasks=8 scripts/slurm-job.sh
#   FERRY_ELASTIC=1:8 sbatch --ntasks=2 scripts/slurm-job.sh  # elastic: 2 now, up to 8
#
# An elastic job (FERRY_ELASTIC=MIN:MAX: --elastic, ranks picked at join) takes more
# trainers while it runs: a later srun step into the allocation joins it, e.g.
#   srun --jobid=<id> --overlap -n 2 ferry-trainer --ps <targets> --job slurm-<id> \
#       --elastic MIN:MAX <the same arguments>
#
# Environment: FERRY_SERVERS (K, default 2), FERRY_PORT (first port, default 7000),
# FERRY_BIN (directory holding ferry-ps and ferry-trainer; default: from PATH, else
# ./build), FERRY_SYNC (bsp), FERRY_ELASTIC (MIN:MAX: an elastic job), FERRY_TRAINERS
# (the trainers this script starts; default SLURM_NTASKS), FERRY_HOST (one address for every server, e.g.
# 127.0.0.1 on a one-node allocation; default: each server's node name, listening on
# every interface). Arguments go to every ferry-trainer (default data:
# data/ptb under the submit directory).
set -euo pipefail
: "${SLURM_JOB_ID:?run me with sbatch (or inside salloc)}"
K=${FERRY_SERVERS:-2}
PORT=${FERRY_PORT:-7000}
BIN=${FERRY_BIN:-}
if [ -z "$BIN" ]; then
    if command -v ferry-ps >/dev/null; then BIN=$(dirname "$(command -v ferry-ps)"); else BIN=build; fi
fi
PS_BIN=$BIN/ferry-ps
TRAINER_BIN=$BIN/ferry-trainer
[ -x "$PS_BIN" ] || PS_BIN=$BIN/server/ferry-ps
[ -x "$TRAINER_BIN" ] || TRAINER_BIN=$BIN/worker/ferry-trainer
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
targets=""
host_of() { echo "${FERRY_HOST:-${nodes[$(($1 % ${#nodes[@]}))]}}"; }
for i in $(seq 0 $((K - 1))); do
    targets+="${targets:+,}$(host_of "$i"):$((PORT + i))"
done
N=${FERRY_TRAINERS:-$SLURM_NTASKS}
echo "ferry under Slurm job $SLURM_JOB_ID: $K servers ($targets), $N ranks${FERRY_ELASTIC:+ (elastic $FERRY_ELASTIC)}"

# Server i: task i of a step of K tasks, cyclic over the nodes, port PORT + i.
srun --overlap --ntasks="$K" --distribution=cyclic --kill-on-bad-exit=0 \
    bash -c "exec \"$PS_BIN\" --listen ${FERRY_HOST:-0.0.0.0}:\$(($PORT + SLURM_PROCID)) --insecure --server-id ps\$SLURM_PROCID" &
servers=$!
trap 'kill "$servers" 2>/dev/null || true; wait "$servers" 2>/dev/null || true' EXIT
for i in $(seq 0 $((K - 1))); do
    host=$(host_of "$i")
    for _ in $(seq 300); do
        (exec 3<>"/dev/tcp/$host/$((PORT + i))") 2>/dev/null && break
        sleep 0.1
    done
done

args=("$@")
[[ " ${args[*]} " == *" --data "* ]] || args=(--data "${SLURM_SUBMIT_DIR:-.}/data/ptb" "${args[@]}")
if [ -n "${FERRY_ELASTIC:-}" ]; then
    mode=(--elastic "$FERRY_ELASTIC")
else
    mode=(--sync "${FERRY_SYNC:-bsp}")
fi
srun --overlap --ntasks="$N" --kill-on-bad-exit=1 \
    "$TRAINER_BIN" --ps "$targets" --job "slurm-$SLURM_JOB_ID" "${mode[@]}" "${args[@]}"
