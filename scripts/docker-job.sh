#!/usr/bin/env bash
# The compose job for real, start to finish: base images (scripts/docker-base.sh), the
# ferry image from this checkout (git archive: only tracked files go in), then
# docker/compose.yml's 2 servers and 2 ranks on a compose network of their own until
# both ranks exit; checks that both exited 0 and logged the same validation loss, and
# that rank 0 had the servers write "<job>-step<N>.ckpt"; then `down -v` and a check
# that no container, network or volume of the project is left. Run by hand (it
# compiles ferry inside the image: minutes); the log goes to runs/docker-job.log.
#
#   scripts/docker-job.sh [TRAINER FLAGS...]     # default: a 300-step epoch slice
set -euo pipefail
cd "$(dirname "$0")/.."
args=${*:-"--epochs 1 --train-tokens 120000 --eval-tokens 10000 --log-interval 100"}
project=ferryjob
mkdir -p runs
log=runs/docker-job.log
compose() {
    if docker compose version >/dev/null 2>&1; then docker compose -p "$project" -f docker/compose.yml "$@"
    else docker-compose -p "$project" -f docker/compose.yml "$@"; fi
}
bash scripts/docker-base.sh
echo "building ferry:latest from $(git rev-parse --short HEAD)" >&2
git archive --format=tar HEAD |
    DOCKER_BUILDKIT=0 docker build --network host -f docker/Dockerfile -t ferry:latest - >"$log.build" 2>&1 ||
    { echo "image build failed: $(tail -5 "$log.build")" >&2; exit 1; }
trap 'compose down -v >/dev/null 2>&1 || true' EXIT
t0=$(date +%s)
FERRY_TRAINER_ARGS="$args" compose up --no-build -d
rc0=$(docker wait "$(compose ps -q rank0)")
rc1=$(docker wait "$(compose ps -q rank1)")
compose logs --no-color >"$log" 2>&1
echo "ranks exited $rc0 and $rc1 after $(($(date +%s) - t0)) s" >&2
[ "$rc0" = 0 ] && [ "$rc1" = 0 ] || { echo "a rank failed: see $log" >&2; exit 1; }
[ "$(grep "epoch 1 valid" "$log" | sed 's/.*valid: //; s/ (.*//' | sort -u | wc -l)" -eq 1 ] ||
    { echo "the ranks disagree on the validation loss" >&2; exit 1; }
ckpt=$(docker run --rm -v "${project}_ps0-ckpt:/c" debian:bookworm ls /c)
echo "ps0 checkpoint volume: $ckpt" >&2
[[ "$ckpt" == compose-step*.ckpt ]] || { echo "no job checkpoint on ps0" >&2; exit 1; }
compose down -v
trap - EXIT
left="$(docker ps -aq --filter "name=$project")$(docker network ls -q --filter "name=$project")$(docker volume ls -q --filter "name=$project")"
[ -z "$left" ] || { echo "left behind: $left" >&2; exit 1; }
grep "epoch 1 valid\|done:" "$log" | sed 's/^.*| //' >&2
echo "compose job: 2 servers + 2 ranks trained and exited 0; down -v left nothing" >&2
