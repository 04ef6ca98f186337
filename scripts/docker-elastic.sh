#!/usr/bin/env bash
# docker/compose.elastic.yml for real: an elastic job scaled while it runs. Base images
# (scripts/docker-base.sh) and the ferry image from this checkout (git archive), then
# the job with one trainer; after it has trained a while `up --scale trainer=3
# --no-recreate` adds two, and later `--scale trainer=2` stops one (SIGTERM: it leaves
# between steps). Checks that every trainer exited 0 (the stopped one too, having left
# the membership), that the members' logs show
# the memberships 1, 3 and 2 with no roll-back, and that `down -v` leaves no
# container, network or volume of the project. Run by hand (it compiles ferry inside
# the image: minutes); the logs go to runs/docker-elastic.log.
#
#   scripts/docker-elastic.sh [TRAINER FLAGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
args=${*:-"--epochs 1 --train-tokens 400000 --eval-tokens 5000 --log-interval 50"}
project=ferryel
mkdir -p runs
log=runs/docker-elastic.log
compose() {
    if docker compose version >/dev/null 2>&1; then docker compose -p "$project" -f docker/compose.elastic.yml "$@"
    else docker-compose -p "$project" -f docker/compose.elastic.yml "$@"; fi
}
bash scripts/docker-base.sh
if [ "${FERRY_IMAGE_BUILT:-0}" != 1 ]; then
    echo "building ferry:latest from $(git rev-parse --short HEAD)" >&2
    git archive --format=tar HEAD |
        DOCKER_BUILDKIT=0 docker build --network host -f docker/Dockerfile -t ferry:latest - >"$log.build" 2>&1 ||
        { echo "image build failed: $(tail -5 "$log.build")" >&2; exit 1; }
fi
trap 'compose down -v >/dev/null 2>&1 || true' EXIT
# trained: the newest step a trainer container has logged.
trained() { compose logs --no-color trainer 2>/dev/null | grep -o 'step [0-9][0-9]*' | tail -1 | grep -o '[0-9]*' || echo 0; }
wait_steps() { # N: until the job's trainers logged step N (at most 10 min)
    for _ in $(seq 600); do [ "$(trained)" -ge "$1" ] && return 0; sleep 1; done
    echo "the job did not reach step $1" >&2; exit 1
}
t0=$(date +%s)
FERRY_TRAINER_ARGS="$args" compose up --no-build -d --scale trainer=1
wait_steps 100
echo "step $(trained): scaling to 3 trainers" >&2
FERRY_TRAINER_ARGS="$args" compose up --no-build -d --no-recreate --scale trainer=3
wait_steps 250
echo "step $(trained): scaling to 2 trainers" >&2
# Compose stops the newest replica and removes it: its exit code and log are taken
# while it stops.
leaver=$(docker ps -q --filter "name=${project}_trainer_3")
[ -n "$leaver" ] || { echo "no third trainer" >&2; exit 1; }
docker wait "$leaver" >"$log.leaver-rc" &
waiter=$!
docker logs -f "$leaver" >"$log.leaver" 2>&1 &
FERRY_TRAINER_ARGS="$args" compose up --no-build -d --no-recreate --scale trainer=2
wait "$waiter"
echo "the third trainer (stopped: SIGTERM) exited $(cat "$log.leaver-rc"): $(grep -o 'elastic: left.*' "$log.leaver")" >&2
[ "$(cat "$log.leaver-rc")" = 0 ] && grep -q 'elastic: left the membership' "$log.leaver" ||
    { echo "the stopped trainer did not leave cleanly: see $log.leaver" >&2; exit 1; }
ids=$(docker ps -aq --filter "label=com.docker.compose.project=$project" \
    --filter "label=com.docker.compose.service=trainer")
rcs=""
for id in $ids; do rcs="$rcs $(docker wait "$id")"; done
compose logs --no-color >"$log" 2>&1
echo "trainers exited:$rcs after $(($(date +%s) - t0)) s" >&2
for rc in $rcs; do [ "$rc" = 0 ] || { echo "a trainer failed: see $log" >&2; exit 1; }; done
grep -q "recover\|rolled back" "$log" && { echo "a roll-back: see $log" >&2; exit 1; }
mem=$(grep -o 'elastic: epoch [0-9]* from step [0-9]*: members [0-9,]* ([0-9]*)' "$log" | sort -u -t' ' -k3,3n)
echo "$mem" >&2
for n in 1 3 2; do
    grep -q "($n)\$" <<<"$mem" || { echo "no membership of $n trainers: see $log" >&2; exit 1; }
done
grep 'epoch 1 test\|done:' "$log" | sed 's/^.*| //' >&2
compose down -v
trap - EXIT
left="$(docker ps -aq --filter "label=com.docker.compose.project=$project")$(docker network ls -q --filter "name=$project")$(docker volume ls -q --filter "name=$project")"
[ -z "$left" ] || { echo "left behind: $left" >&2; exit 1; }
echo "elastic compose job: 1 -> 3 -> 2 trainers, every trainer exited 0, no roll-back; down -v left nothing" >&2
